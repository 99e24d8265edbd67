"""raycpt's model cache: ``<root>/models/<slug>-<hash>/`` folders, their ``raycpt_source.json``, atomic publishing
into place, and what a resolved model is (:class:`ModelInfo`); see :mod:`raycpt.models.sources`."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from raycpt.errors import RaycptError, read_user_json
from raycpt.io import cache_root as user_cache, sha256_file
from raycpt.models.digests import folder_digest
from raycpt.models.refs import Ref


SOURCE_JSON = "raycpt_source.json"


@dataclass
class ModelInfo:
    """A resolved model: where its plain folder is and what it is."""

    ref: str
    """The reference as given."""
    path: str
    """Folder to ``from_pretrained`` (in the cache, or the user's folder for a local HF folder)."""
    cached: bool
    """True when this call found the folder ready (no download, no conversion)."""
    seconds: float
    """Wall time of this resolve."""
    sha256: Optional[str]
    """sha256 of the source: the (joined) GGUF, or of the manifest of a hub download; None in place."""
    model_type: Optional[str] = None
    num_layers: Optional[int] = None
    num_params: Optional[int] = None
    kind: str = ""
    """folder | gguf | pypi | hub."""
    sources: list[dict] = field(default_factory=list)
    """One entry per source file: name, size, sha256 (and the wheel it came from)."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` or ``$RAYCPT_CACHE`` or ``~/.cache/raycpt`` (absolute)."""
    return user_cache(cache_dir)


def cache_key(ref: str, revision: Optional[str]) -> str:
    return hashlib.sha256(f"{ref}@{revision or ''}".encode()).hexdigest()[:12]


def cache_slug(ref: str) -> str:
    last = re.split(r"\+(?=pypi:)|\+", ref)[0].rstrip("/").split("/")[-1] or "model"
    last = re.sub(r"\.gguf(\.part\d+)?$", "", last, flags=re.I)
    slug = re.sub(r"[^a-z0-9]+", "-", last.lower()).strip("-")
    return slug[:60] or "model"


def cache_path(ref: str, cache_dir=None, revision: Optional[str] = None) -> Path:
    """Folder a reference resolves to in the cache (whether or not it exists yet)."""
    return cache_root(cache_dir) / "models" / f"{cache_slug(ref)}-{cache_key(ref, revision)}"


def intact(folder: Path, name: str) -> Optional[dict]:
    """The metadata of a fetched file whose copy still has its recorded sha256, else None."""
    meta = read_meta(folder)
    if meta is None or not (folder / name).is_file() or sha256_file(folder / name) != meta.get("sha256"):
        return None
    return meta


MODEL_DIGESTS = "model-digests.json"
"""Beside ``<cache>/models``: the cached folders' files' sha256 by size, times and inode (:mod:`raycpt.models.digests`)."""


def digest_memo(folder: Path) -> Path:
    """The digest memo of a cached model folder ``<cache>/models/<name>``: ``<cache>/model-digests.json``."""
    return Path(folder).parent.parent / MODEL_DIGESTS


def _meta_seal(meta: dict) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "seal"}, sort_keys=True,
                                     default=str).encode()).hexdigest()


def seal_meta(meta: dict, folder: Path) -> dict:
    """``meta`` (a folder's ``raycpt_source.json`` to be) with the sha256 of every file of ``folder``
    (:func:`raycpt.models.digests.folder_digest`) and its own seal: what :func:`entry_problem` checks."""
    meta = {k: v for k, v in meta.items() if k != "seal"}
    meta["content"] = folder_digest(folder)
    meta["seal"] = _meta_seal(meta)
    return meta


def entry_problem(folder: Path, meta) -> Optional[str]:
    """None when a cached model folder verifies: its ``raycpt_source.json`` matches its seal and every file of the
    folder has the sha256 it recorded (hashed through the digest memo :data:`MODEL_DIGESTS`: a file rewritten in
    place, even with its mtime set back, is hashed again); else why not. What a resolve (every command's model) and
    ``raycpt models list`` both check."""
    if not isinstance(meta, dict) or not isinstance(meta.get("content"), dict):
        return f"its {SOURCE_JSON} records no content digests (pulled by an older raycpt)"
    if meta.get("seal") != _meta_seal(meta):
        return f"its {SOURCE_JSON} does not match its seal (edited after it was written)"
    try:
        now = folder_digest(folder, digest_memo(folder))
    except OSError as e:
        return f"its files cannot be read ({type(e).__name__})"
    for name in sorted(set(now) | set(meta["content"])):
        if name not in now:
            return f"its {name} is missing"
        if name not in meta["content"]:
            return f"it holds {name}, which it was not pulled with"
        if now[name] != meta["content"][name]:
            return f"its {name} does not match its sha256 (changed after it was pulled)"
    return None


def read_meta(folder: Path) -> Optional[dict]:
    f = folder / SOURCE_JSON
    if not f.is_file():
        return None
    try:
        meta = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def still_fresh(meta: dict, parsed: Ref) -> bool:
    """Local GGUF sources must still have the size and mtime they had when converted."""
    if parsed.kind != "gguf":
        return True
    recorded = [(s.get("size"), s.get("mtime_ns")) for s in meta.get("sources", [])]
    now = []
    for p in parsed.parts:
        st = p.stat()
        now.append((st.st_size, st.st_mtime_ns))
    return recorded == now


def info_from_meta(ref: str, folder: Path, meta: dict, cached: bool, seconds: float) -> ModelInfo:
    return ModelInfo(ref=ref, path=str(folder), cached=cached, seconds=seconds, sha256=meta.get("sha256"),
                     model_type=meta.get("model_type"), num_layers=meta.get("num_layers"),
                     num_params=meta.get("num_params"), kind=meta.get("kind", ""), sources=meta.get("sources", []))


def clean_stale_work_dirs(final: Path) -> None:
    """Remove ``.tmp-<name>-<pid>`` folders of pulls whose process is gone (killed mid-pull)."""
    for d in final.parent.glob(f".tmp-{final.name}-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def publish(out: Path, final: Path, replace: bool) -> None:
    """Move the finished folder into place with one rename.

    Without ``replace``, a complete folder that a concurrent pull of the same reference published
    first is kept (ours is dropped); with it (``force``, or a stale local-file conversion) the old
    folder is swapped out, then removed."""
    if final.exists() and read_meta(final) is not None and not replace:
        return
    old = None
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    try:
        os.rename(out, final)
    except OSError:
        if read_meta(final) is None:  # not a concurrent pull that finished first
            if old is not None and not final.exists():
                os.rename(old, final)
                old = None
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def describe_in_place(ref: str, folder: Path, t0: float) -> ModelInfo:
    desc = describe_folder(folder)
    return ModelInfo(ref=ref, path=str(folder), cached=True, seconds=time.perf_counter() - t0, sha256=None,
                     model_type=desc.get("model_type"), num_layers=desc.get("num_layers"),
                     num_params=desc.get("num_params"), kind="folder")


def describe_folder(folder: Path) -> dict:
    """model_type / layers / params of a saved HF folder, from config.json and safetensors headers only."""
    try:
        cfg = read_user_json(folder / "config.json", "config.json")  # the bounded reader: a FIFO does not hang
    except RaycptError:
        cfg = {}
    text = cfg.get("text_config") or {}
    num_params = 0
    for f in folder.glob("*.safetensors"):
        num_params += _safetensors_numel(f)
    return dict(model_type=cfg.get("model_type"), architectures=cfg.get("architectures"),
                num_layers=cfg.get("num_hidden_layers", text.get("num_hidden_layers")),
                hidden_size=cfg.get("hidden_size", text.get("hidden_size")),
                vocab_size=cfg.get("vocab_size", text.get("vocab_size")),
                num_params=num_params or None)


def _safetensors_numel(path: Path) -> int:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
