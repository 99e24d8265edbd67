"""Content digests of files, hashed once: what a cache keyed by content (the sweep's base row, :mod:`raycpt.jobs.base_row`)
knows a model folder by.

A model's weights are gigabytes; a sweep asks for their digests more than once (a resumed sweep, the next sweep of
the same model). :func:`file_digests` hashes a file once and keeps its sha256 in a memo file beside the cache,
under the file's real path with its size, modification time, change time, inode and device: a file rewritten in
place (a re-download, a fine-tuned copy written over the old folder) changes at least its change time, which no
user command can set back, so it is hashed again; a file whose five numbers are unchanged is taken at its digest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional

from raycpt.io import atomic_write_json, sha256_file

MEMO_FORMAT = "raycpt.digest-memo/1"
NOT_CONTENT = {"raycpt_source.json"}
"""Files of a model folder that say where it came from, not what it computes: left out of its digest."""


def _stamp(st: os.stat_result) -> list:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _read_memo(memo: Optional[Path]) -> dict:
    try:
        doc = json.loads(Path(memo).read_text(encoding="utf-8")) if memo else {}
    except (OSError, ValueError, UnicodeDecodeError):
        return {}  # an unreadable memo is no memo: every file is hashed again
    ok = isinstance(doc, dict) and doc.get("format") == MEMO_FORMAT and isinstance(doc.get("files"), dict)
    return doc["files"] if ok else {}


def file_digests(paths: Iterable[Path], memo: Optional[Path] = None) -> dict[str, str]:
    """``{str(path): sha256}`` of every file in ``paths`` (symbolic links followed), each hashed only when the memo
    file ``memo`` has no entry for its real path with the same size, times, inode and device; the memo is updated
    (written aside and renamed; a memo that cannot be written only costs hashing again next time)."""
    known = _read_memo(memo)
    out, changed = {}, False
    for p in paths:
        real = os.path.realpath(p)
        st = os.stat(real)
        entry = known.get(real)
        if isinstance(entry, dict) and entry.get("stat") == _stamp(st) and isinstance(entry.get("sha256"), str):
            out[str(p)] = entry["sha256"]
            continue
        digest = sha256_file(Path(real))
        if _stamp(os.stat(real)) != _stamp(st):  # written while we read: do not remember a digest of a moving file
            out[str(p)] = digest
            continue
        known[real] = {"stat": _stamp(st), "sha256": digest}
        out[str(p)] = digest
        changed = True
    if changed and memo is not None:
        try:
            atomic_write_json(Path(memo), {"format": MEMO_FORMAT, "files": known})
        except OSError:
            pass
    return out


def remember_digests(digests: dict, memo: Path) -> None:
    """Put files hashed as they were written (``{path: sha256}``, e.g. a packed store's shards) into the memo file
    ``memo`` under their real paths and current stat, so the next :func:`file_digests` of them hashes nothing; a
    memo that cannot be written only costs hashing them once more."""
    known = _read_memo(memo)
    for p, digest in digests.items():
        real = os.path.realpath(p)
        known[real] = {"stat": _stamp(os.stat(real)), "sha256": digest}
    try:
        atomic_write_json(Path(memo), {"format": MEMO_FORMAT, "files": known})
    except OSError:
        pass


def folder_files(folder) -> list[Path]:
    """The files that make a model folder what it is: every regular file at its top level (weights, config,
    tokenizer; links followed), hidden files and :data:`NOT_CONTENT` left out, sorted by name."""
    folder = Path(folder)
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.name not in NOT_CONTENT)


def folder_digest(folder, memo: Optional[Path] = None) -> dict[str, str]:
    """``{file name: sha256}`` of :func:`folder_files` (hashed through the memo, :func:`file_digests`)."""
    files = folder_files(folder)
    digests = file_digests(files, memo)
    return {p.name: digests[str(p)] for p in files}
