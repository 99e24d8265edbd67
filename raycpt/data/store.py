"""The packed-token store: where it lives, what identifies it, its manifest, and its freshness.

One store per (corpus sources, tokenizer, ``data.seq_len``, ``data.text_field``,
``data.max_documents``), in ``<store_root>/<key>/`` where ``store_root`` is ``data.store_dir`` or
``<tracking.run_root>/packed`` (shared storage on a cluster) and ``key`` is a hash of those five
things and the format version::

    <store_root>/<key>/manifest.json            written last; sealed with the sha256 of the rest of it
    <store_root>/<key>/shards/0000/0000000.npy  one (blocks, seq_len) uint16/int32 array per chunk
    <store_root>/builds.jsonl                   one line per pack that tokenised anything
    <store_root>/digests.json                   the shards' sha256 by size, times and inode (a digest memo)

A store is a claim about content: its manifest names each shard's size and sha256 (hashed as it was written) and
carries its own seal; every reader checks them (:func:`store_problem`) and ``raycpt data info`` prints the same
verdict (:func:`store_state`); a store that does not verify is packed again with one line saying why.

A pack is built in ``<store_root>/.tmp-<key>-<id>/`` under a file lock and renamed into place, so
an interrupted pack leaves nothing that looks complete (the next build removes the leftovers).

The manifest keeps a fingerprint of every source file (path, size, mtime, and the SHA-256 of the
whole file up to :data:`FULL_HASH_BYTES`, else of :data:`SAMPLES` evenly spaced 64 KiB samples
and the size). A later command checks size and mtime (one ``stat`` per file); only when they
differ is the hash read again (a ``touch`` alone is not a change). A changed corpus is refused
with one line that says how to re-pack, so no run silently mixes two versions of a corpus.

The size-and-mtime shortcut misses an edit that keeps both (``cp -p``, ``touch -r``): ``data.verify:
content`` records the SHA-256 of every whole file at pack time and hashes every file again on every
check (a full read of the corpus per command). :attr:`StoreInfo.identity` names what a store holds
(its key and its files' hashes); a checkpoint records it and ``--resume`` compares it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from raycpt.data.corpus import (FORTUNE_FILES, FORTUNES_DIR, GLOSSES, MAX_CHUNK_BYTES, offline, expand_source,
                                hf_parquet_files)
from raycpt.errors import RaycptError
from raycpt.models.digests import file_digests

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
BUILD_LOG = "builds.jsonl"
FULL_HASH_BYTES = 8 << 20
SAMPLES = 16
SAMPLE_BYTES = 64 << 10
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json")


def store_root(data_cfg, run_root) -> Path:
    """``data.store_dir`` if set, else ``<run_root>/packed``; absolute."""
    base = data_cfg.store_dir if getattr(data_cfg, "store_dir", None) else Path(run_root) / "packed"
    return Path(base).expanduser().resolve()


# ------------------------------------------------------------------------------------ identity

def _source_id(source: str) -> str:
    if source.startswith(("builtin:", "debian:", "hf:")):
        return source
    return os.path.abspath(os.path.expanduser(source))


def tokenizer_hash(tokenizer_path: str) -> str:
    """SHA-256 over the names and bytes of the tokenizer files of a model folder."""
    h = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        p = Path(tokenizer_path) / name
        if p.is_file():
            found = True
            h.update(name.encode() + b"\0" + p.read_bytes() + b"\0")
    if not found:
        raise RaycptError(f"{tokenizer_path} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}): cannot pack")
    return h.hexdigest()


def store_key(data_cfg, tok_hash: str) -> str:
    """The store's folder name: a hash of what decides its contents."""
    ident = {"format": FORMAT_VERSION, "chunking": MAX_CHUNK_BYTES, "sources": [_source_id(s) for s in data_cfg.corpus],
             "tokenizer": tok_hash, "seq_len": int(data_cfg.seq_len), "text_field": data_cfg.text_field,
             "max_documents": data_cfg.max_documents}
    share = float(getattr(data_cfg, "heldout_share", 0.0) or 0.0)
    if share > 0:  # documents held out of this store (old stores, without any, keep their key)
        ident["heldout"] = [share, int(getattr(data_cfg, "heldout_seed", 0))]
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------ fingerprints

def file_hash(path: str, size: Optional[int] = None, full: bool = False) -> tuple[str, str]:
    """``(kind, hex)``: the whole file's SHA-256 up to FULL_HASH_BYTES (or at any size with ``full``),
    else a sampled one."""
    size = os.path.getsize(path) if size is None else size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if full or size <= FULL_HASH_BYTES:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return "full", h.hexdigest()
        h.update(str(size).encode())
        for i in range(SAMPLES):
            f.seek((size - SAMPLE_BYTES) * i // (SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
    return "sampled", h.hexdigest()


def _source_files(source: str) -> list[dict]:
    if source == "builtin:wordnet-glosses":
        return [{"path": str(GLOSSES)}]
    if source == "debian:fortunes-zh":
        return [{"path": str(FORTUNES_DIR / n)} for n in FORTUNE_FILES if (FORTUNES_DIR / n).is_file()]
    if source.startswith("hf:"):
        return [{"path": f["url"], "size": f["size"], "remote": True} for f in hf_parquet_files(source)]
    if source.startswith(("builtin:", "debian:")):
        return []  # plan_chunks names the unknown source
    return [{"path": p} for p in expand_source(source)]


def fingerprints(sources: Sequence[str], hashes: bool = True, full: bool = False) -> list[dict]:
    """One record per file read: ``{source, path, size, mtime_ns[, hash_kind, sha256]}`` (``full``: the
    whole-file SHA-256 whatever the size, what ``data.verify: content`` compares)."""
    out = []
    for source in sources:
        for f in _source_files(source):
            if f.get("remote"):
                out.append({"source": source, "path": f["path"], "size": f["size"]})
                continue
            st = os.stat(f["path"])
            rec = {"source": source, "path": f["path"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            if hashes:
                rec["hash_kind"], rec["sha256"] = file_hash(f["path"], st.st_size, full=full)
            out.append(rec)
    return out


def changed_files(recorded: list[dict], sources: Sequence[str], content: bool = False) -> Optional[str]:
    """None when the corpus still matches the manifest's fingerprints, else what changed (short).
    ``content`` (``data.verify: content``): every local file is hashed whole and compared, whatever its
    size and mtime say."""
    offline_hub = [s for s in sources if s.startswith("hf:") and offline()]  # trust the manifest offline
    now = fingerprints([s for s in sources if s not in offline_hub], hashes=False)
    now += [r for r in recorded if r["source"] in offline_hub]
    old = {r["path"]: r for r in recorded}
    new = {r["path"]: r for r in now}
    if set(old) != set(new):
        added, gone = sorted(set(new) - set(old)), sorted(set(old) - set(new))
        return f"{added[0]} is new" if added else f"{gone[0]} is gone"
    for path, r in new.items():
        o = old[path]
        if r["size"] != o["size"]:
            return f"{path} changed (size {o['size']:,} -> {r['size']:,} bytes)"
        if content and "mtime_ns" in r:
            if o.get("hash_kind") != "full":
                return (f"{path} was fingerprinted by samples when it was packed, so its content cannot be "
                        "compared (data.verify: content needs a store packed with it)")
            if file_hash(path, r["size"], full=True)[1] != o["sha256"]:
                return f"{path} changed (same size, different content)"
            continue
        if r.get("mtime_ns") == o.get("mtime_ns"):
            continue
        if "sha256" in o and file_hash(path, r["size"])[1] == o["sha256"]:
            continue  # touched, same bytes
        return f"{path} changed (same size, different content)"
    return None


def corpus_identity(key: str, recorded: list[dict]) -> str:
    """What a store holds, in 16 hex digits: its key (sources, tokenizer, seq_len, ...) and every source
    file's path, size and hash as fingerprinted when it was packed (a re-pack of unchanged files keeps it)."""
    files = sorted((r["path"], r["size"], r.get("sha256")) for r in recorded)
    return hashlib.sha256(json.dumps([key, files]).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------ manifests

@dataclass
class StoreInfo:
    """A complete store as its manifest describes it."""

    path: Path
    manifest: dict

    @property
    def key(self) -> str:
        return self.path.name

    @property
    def num_blocks(self) -> int:
        return int(self.manifest["num_blocks"])

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_blocks"]) * int(self.manifest["seq_len"])

    @property
    def build_id(self) -> str:
        return str(self.manifest["build_id"])

    @property
    def identity(self) -> str:
        """:func:`corpus_identity` of this store: what a checkpoint records and ``--resume`` compares."""
        return corpus_identity(self.key, self.manifest.get("fingerprints", []))

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def describe(self) -> str:
        m = self.manifest
        return (f"{m['num_blocks']:,} blocks x {m['seq_len']} tokens = {self.num_tokens:,} tokens "
                f"({m['num_documents']:,} documents, {m['dtype']}, build {m['build']}, "
                f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(m['created']))} UTC)")


def read_store(path: Path) -> Optional[StoreInfo]:
    """The store in ``path`` if its manifest is there and of this format, else None (whether it verifies is
    :func:`store_problem`'s)."""
    try:
        m = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(m, dict) or m.get("format") != FORMAT_VERSION:
        return None
    return StoreInfo(Path(path), m)


# ------------------------------------------------------------------------------------ verification

SEAL = "seal"
"""In a manifest: the sha256 of the rest of it (:func:`manifest_seal`), so an edited manifest does not verify."""
DIGEST_MEMO = "digests.json"
"""In the store root: the shard files' sha256 by size, times and inode (:mod:`raycpt.models.digests`)."""


def manifest_seal(manifest: dict) -> str:
    """The sha256 of a manifest without its :data:`SEAL` (keys sorted)."""
    body = {k: v for k, v in manifest.items() if k != SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _shape_problem(m: dict) -> Optional[str]:
    if m.get(SEAL) is None:
        return "its manifest has no seal (packed by an older raycpt)"
    if m[SEAL] != manifest_seal(m):
        return "its manifest does not match its seal (edited after it was packed)"
    shards = m.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) and isinstance(s.get("file"), str)
                                               and isinstance(s.get("bytes"), int) and isinstance(s.get("sha256"), str)
                                               and isinstance(s.get("blocks"), int) for s in shards):
        return "its manifest lists no shard sizes and sha256s"
    if sum(s["blocks"] for s in shards) != m.get("num_blocks"):
        return "its manifest's block count is not the sum of its shards'"
    return None


def store_problem(store: StoreInfo, content: bool = False) -> Optional[str]:
    """None when a store's own files verify: its manifest matches its seal and every shard it lists is there with
    the size and sha256 recorded when it was packed; else why not, in a few words. Shards are hashed through the
    digest memo of the store root (:data:`DIGEST_MEMO`: a shard whose size, times and inode are unchanged is taken
    at its digest; a shard rewritten in place, even with its mtime set back, is hashed again); ``content``
    (``data.verify: content``): every shard hashed whole, memo or not. What :func:`raycpt.data.pack.ensure_packed`
    (every command that reads a store) and ``raycpt data info`` both check."""
    why = _shape_problem(store.manifest)
    if why is not None:
        return why
    files = []
    for s in store.manifest["shards"]:
        p = store.path / s["file"]
        if not p.is_file():
            return f"its shard {s['file']} is missing"
        if p.stat().st_size != s["bytes"]:
            return f"its shard {s['file']} is {p.stat().st_size:,} bytes, not the {s['bytes']:,} packed"
        files.append(p)
    digests = file_digests(files, None if content else store.path.parent / DIGEST_MEMO)
    for s, p in zip(store.manifest["shards"], files):
        if digests[str(p)] != s["sha256"]:
            return f"its shard {s['file']} does not match its sha256 (changed after it was packed)"
    return None


def corpus_problem(store: StoreInfo, content: bool = False, sources: Optional[Sequence[str]] = None) -> Optional[str]:
    """None when the corpus files a store was packed from (``sources``, default the manifest's) are unchanged
    (:func:`changed_files`, by stat or, with ``content``, by whole-file sha256), else what changed."""
    return changed_files(store.manifest["fingerprints"], store.manifest["sources"] if sources is None else sources,
                         content=content)


def store_state(store: StoreInfo, content: bool = False) -> str:
    """One verdict for a store, the one every user of it reaches (``raycpt data info`` prints it): ``corpus:
    current``, ``store damaged: <why> ...`` (packed again when next read) or ``corpus: <what changed>`` (refused
    until ``--rebuild``)."""
    why = store_problem(store, content)
    if why is not None:
        return f"store damaged: {why}; packed again when next read"
    try:
        what = corpus_problem(store, content)
    except RaycptError as e:
        what = str(e)
    return f"corpus: {what or 'current'}"


def list_stores(root: Path) -> list[StoreInfo]:
    """Every complete store under ``root``, oldest first."""
    root = Path(root)
    found = [read_store(p) for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith(".")] \
        if root.is_dir() else []
    return sorted((s for s in found if s is not None), key=_created)


def _created(store: StoreInfo) -> float:
    c = store.manifest.get("created")
    return float(c) if isinstance(c, (int, float)) and not isinstance(c, bool) else 0.0


def builds_logged(root: Path, key: Optional[str] = None) -> list[dict]:
    """The lines of ``builds.jsonl`` (one per pack that tokenised), optionally of one store."""
    p = Path(root) / BUILD_LOG
    if not p.is_file():
        return []
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return [r for r in rows if key is None or r.get("key") == key]


def log_build(root: Path, record: dict) -> None:
    with open(Path(root) / BUILD_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


@contextlib.contextmanager
def build_lock(root: Path, key: str) -> Iterator[None]:
    """An exclusive lock on ``<root>/.<key>.lock`` (``flock``), so concurrent commands pack once."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{key}.lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
