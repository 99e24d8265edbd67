"""File helpers every layer may use: atomic writes and the run root. A leaf: imports nothing of raycpt.

Files are written aside and renamed into place (:func:`atomic_write_text`), so an interrupted command
never leaves half a file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any


def atomic_write_text(path: Path, text: str, in_place_when_full: bool = False) -> Path:
    """Write ``text`` to ``path`` (UTF-8) through a temporary file in the same folder and a rename.

    ``in_place_when_full``: when the file system has no room for the temporary file (ENOSPC, EDQUOT) and ``path``
    exists, rewrite ``path`` itself instead (its truncation frees the blocks the new text takes): a small record
    such as a run's ``state.json`` then still says how the run ended on a full disk, where the atomic write
    cannot (measured on a real full tmpfs: the run stayed ``running``). Not atomic: only for files whose reader
    takes a torn file as absent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if not (in_place_when_full and e.errno in (errno.ENOSPC, errno.EDQUOT) and path.is_file()):
            raise
        try:
            with open(path, "r+b") as f:
                f.truncate(0)
                f.write(text.encode("utf-8"))
        except OSError:
            raise e from None
        return path
    os.replace(tmp, path)
    return path


def cache_root(cache_dir: "str | os.PathLike | None" = None) -> Path:
    """``cache_dir`` or ``$RAYCPT_CACHE`` or ``~/.cache/raycpt`` (absolute): the user's cache (models, store
    templates), shared by every run root."""
    root = cache_dir or os.environ.get("RAYCPT_CACHE") or Path.home() / ".cache" / "raycpt"
    return Path(root).expanduser().absolute()


def copy_chunks(src, out, *on_chunk) -> int:
    """Copy the open binary file ``src`` into ``out`` in 4 MiB chunks, handing each chunk to every ``on_chunk``
    (a hasher's ``update``, a progress bar's ``advance``-by-length); returns the bytes copied."""
    n = 0
    for chunk in iter(lambda: src.read(1 << 22), b""):
        out.write(chunk)
        n += len(chunk)
        for f in on_chunk:
            f(chunk)
    return n


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_json(path: Path, obj: Any, in_place_when_full: bool = False) -> Path:
    """:func:`atomic_write_text` of ``obj`` as indented JSON (non-JSON values written with ``str``)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str),
                             in_place_when_full=in_place_when_full)


SEAL_FORMAT = "raycpt.memo-seal/1"


def seal_path(path: Path) -> Path:
    """Beside a sealed JSON file ``<name>``: ``.<name>.seal``, written after it, naming its sha256."""
    path = Path(path)
    return path.with_name(f".{path.name}.seal")


def write_seal(path: Path) -> Path:
    """The seal of a file already in place (:func:`seal_path`: its sha256), written after it: a write cut short before
    it, or a change after it, leaves a file that does not verify (:func:`seal_problem`)."""
    path = Path(path)
    return atomic_write_json(seal_path(path), {"format": SEAL_FORMAT, "sha256": sha256_file(path)})


def read_manifest(path: Path, fmt: str, missing: str = "") -> "tuple[dict | None, str | None]":
    """A manifest (a JSON object whose ``format`` is ``fmt``) and None, or None and why not in a few words naming the
    file: it does not exist (``missing`` appended, e.g. why it may be absent), cannot be read, or is not one."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"it has no {path.name}{missing}"
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return None, f"its {path.name} cannot be read ({type(e).__name__})"
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        return None, f"its {path.name} is not a {fmt} record"
    return doc, None


def seal_problem(path: Path, made: str = "written") -> "str | None":
    """None when ``path``'s seal names its sha256; else why not, in a few words (no seal, a seal that cannot be read
    or is not one, a file changed after it was ``made``, even with its size and mtime kept). THE check of every
    sealed cache file (a memo, an evaluation record, the MLflow store template)."""
    path = Path(path)
    try:
        seal = json.loads(seal_path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"it has no seal (cut short, or {made} by an older raycpt)"
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"its seal cannot be read ({type(e).__name__})"
    if not isinstance(seal, dict) or seal.get("format") != SEAL_FORMAT:
        return f"its seal is not a {SEAL_FORMAT} record"
    try:
        digest = sha256_file(path)
    except OSError as e:
        return f"it cannot be read ({type(e).__name__})"
    return None if seal.get("sha256") == digest else \
        f"it does not match the sha256 in its seal (changed after it was {made})"


def write_sealed_json(path: Path, obj: Any) -> Path:
    """:func:`atomic_write_json`, then its seal (:func:`write_seal`)."""
    path = Path(path)
    atomic_write_json(path, obj)
    write_seal(path)
    return path


def sealed_json_problem(path: Path) -> "str | None":
    """None when ``path`` verifies (:func:`seal_problem`) and holds a JSON object; else why not, in a few words."""
    why = seal_problem(path)
    if why is not None:
        return why
    try:
        doc = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"it is not JSON ({type(e).__name__})"
    return None if isinstance(doc, dict) else f"it holds a {type(doc).__name__}, not an object"

