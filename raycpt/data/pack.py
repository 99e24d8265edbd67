"""Pack once: tokenise the corpus into the packed-token store (see :mod:`raycpt.data.store`).

:func:`ensure_packed` returns the store for a data config, building it when it is missing: the
corpus is cut into chunks (:func:`raycpt.data.corpus.plan_chunks`) and every chunk is one Ray Data
task (``ray.data.from_items(chunks).map(...)``, one CPU each, as many at once as the cluster has
CPUs; without Ray the same function runs chunk after chunk in this process). A task reads its
chunk, encodes its documents in batches with the model's fast tokenizer (Rust ``encode_batch``, no
special tokens), appends EOS to every document, cuts the stream into ``seq_len`` blocks (the last
partial block of a chunk is dropped) and writes them as one ``.npy`` file (uint16 when the
vocabulary fits, else int32) straight into the store's temporary folder, returning only a small
record. With ``data.max_documents`` a first pass counts each chunk's documents (in waves, stopping
once enough are counted) so each task knows how many of its documents to keep.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import socket
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from raycpt.data.corpus import check_corpus, chunk_documents, eos_id_of, is_heldout
from raycpt.data.store import (DIGEST_MEMO, FORMAT_VERSION, MANIFEST, SEAL, StoreInfo, build_lock, corpus_problem,
                               fingerprints, log_build, manifest_seal, read_store, store_key, store_problem, store_root,
                               tokenizer_hash)
from raycpt.errors import RaycptError
from raycpt.io import sha256_file
from raycpt.models.digests import remember_digests
from raycpt.progress import progress_bar

ENCODE_DOCS = 1024
"""Documents per ``encode_batch`` call inside a pack task."""
log = logging.getLogger(__name__)


TOKENIZER_FILE = "tokenizer.json"
"""The model tokenizer's Rust backend, serialised by the driver into the store's temporary folder."""


@functools.lru_cache(maxsize=2)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@functools.lru_cache(maxsize=4)
def _backend(tokenizer_file: str):
    """The fast tokenizer a pack task encodes with, loaded with ``tokenizers`` alone: a Ray worker that
    imported transformers (and torch with it) to build ``AutoTokenizer`` spent ~2.6 s per process on
    2 cores before its first document, the largest cost of a small pack."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(tokenizer_file)


def _encode(backend, docs: list[str]) -> list[list[int]]:
    fast = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
    return [e.ids for e in fast(docs, add_special_tokens=False)]


def shard_name(index: int) -> str:
    return f"shards/{index // 1000:04d}/{index:07d}.npy"


def pack_chunk(chunk: dict, tokenizer_file: str, seq_len: int, eos_id: int, dtype: str, out_dir: str,
               doc_limit: Optional[int] = None, heldout_share: float = 0.0, heldout_seed: int = 0) -> dict:
    """Tokenise and pack one chunk into ``out_dir/<shard_name>``; return its record. ``tokenizer_file``
    is the serialised backend (:data:`TOKENIZER_FILE`, written by the driver). Documents the held-out hash
    selects (:func:`raycpt.data.corpus.is_heldout`, ``heldout_share`` > 0) count towards ``doc_limit`` but
    are left out of the store."""
    backend = _backend(tokenizer_file)
    parts: list[np.ndarray] = []  # int32 per encode batch: 4 bytes a token, not a Python int each
    batch: list[str] = []
    docs = read = 0

    def flush():
        flat: list[int] = []
        for ids in _encode(backend, batch):
            flat.extend(ids)
            flat.append(eos_id)
        parts.append(np.asarray(flat, dtype=np.int32))
        batch.clear()

    for doc in chunk_documents(chunk):
        if doc_limit is not None and read >= doc_limit:
            break
        read += 1
        if heldout_share > 0 and is_heldout(doc, heldout_share, heldout_seed):
            continue
        batch.append(doc)
        docs += 1
        if len(batch) >= ENCODE_DOCS:
            flush()
    flush()
    flat = np.concatenate(parts)
    n = len(flat) // seq_len
    blocks = flat[: n * seq_len].astype(dtype).reshape(n, seq_len)
    rel = shard_name(chunk["index"])
    dest = Path(out_dir) / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.save(dest, blocks)
    return {"index": chunk["index"], "file": rel, "blocks": n, "documents": docs, "tokens": len(flat),
            "bytes": dest.stat().st_size, "sha256": sha256_file(dest)}


def count_chunk(chunk: dict) -> dict:
    return {"index": chunk["index"], "documents": sum(1 for _ in chunk_documents(chunk))}


# ------------------------------------------------------------------------------------ running chunks

_REMOTE_RAYCPT_ERROR = re.compile(r"^raycpt\.errors\.\w+: (.+)$", re.MULTILINE)


def _raycpt_cause(e: BaseException) -> Optional[RaycptError]:
    """The RaycptError behind ``e``: in its chain, or - where Ray Data's ``RayTaskError(UserCodeException)``
    carries the task's error only as its traceback text (the chain ends at the UserCodeException) - the last
    ``raycpt.errors.RaycptError: ...`` line of that text."""
    seen, cur, texts = set(), e, []
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, RaycptError):
            return RaycptError(str(cur).splitlines()[0] if str(cur) else type(cur).__name__)
        texts.append(str(cur))
        cur = getattr(cur, "cause", None) or cur.__cause__ or cur.__context__
    found = [m.group(1).strip() for t in texts for m in _REMOTE_RAYCPT_ERROR.finditer(t)]
    return RaycptError(found[-1]) if found else None


def _row_task(row: dict, fn_name: str, kwargs: dict) -> dict:
    fn = {"pack": pack_chunk, "count": count_chunk}[fn_name]
    extra = {"doc_limit": row["limit"]} if fn_name == "pack" and row["limit"] >= 0 else {}
    return {"out": json.dumps(fn(json.loads(row["chunk"]), **kwargs, **extra))}


def run_chunks(fn_name: str, chunks: Sequence[dict], kwargs: dict, limits: Optional[Sequence[int]] = None,
               on_done: Optional[Callable[[dict], None]] = None) -> list[dict]:
    """``pack_chunk`` / ``count_chunk`` over ``chunks``: Ray Data tasks when Ray is up, else a local
    process pool (:func:`_local_rows`). Results in chunk order; a RaycptError inside a task comes back as
    one line."""
    import ray

    limits = list(limits) if limits is not None else [-1] * len(chunks)
    out: list[dict] = []
    try:
        if ray.is_initialized() and chunks:
            import ray.data as rd
            from ray.data import DataContext

            logging.getLogger("ray.data").setLevel(logging.ERROR)
            ctx = DataContext.get_current()
            ctx.enable_progress_bars = False
            ctx.execution_options.preserve_order = False
            items = [{"chunk": json.dumps(c), "limit": int(lim)} for c, lim in zip(chunks, limits)]
            ds = rd.from_items(items, override_num_blocks=len(items))
            ds = ds.map(_row_task, fn_kwargs={"fn_name": fn_name, "kwargs": kwargs}, num_cpus=1)
            rows = (json.loads(r["out"]) for r in ds.iter_rows())
        else:
            rows = _local_rows(fn_name, chunks, kwargs, limits)
        for rec in rows:
            out.append(rec)
            if on_done is not None:
                on_done(rec)
    except Exception as e:  # noqa: BLE001 - a user error inside a task is one line
        err = _raycpt_cause(e)
        if err is None:
            raise
        raise err from None
    return sorted(out, key=lambda r: r["index"])


def _local_task(fn_name: str, chunk: dict, kwargs: dict, limit: int) -> dict:
    if fn_name == "count":
        return count_chunk(chunk)
    return pack_chunk(chunk, **kwargs, **({"doc_limit": limit} if limit >= 0 else {}))


def die_with_parent(parent_pid: int) -> None:
    """A pack process's first act: ask Linux to SIGKILL it when the process that started it dies
    (``prctl(PR_SET_PDEATHSIG)``; a ``kill -9`` of ``raycpt data prepare`` then leaves no packer running),
    and exit at once when that parent is already gone. Elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl
            pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _local_rows(fn_name: str, chunks: Sequence[dict], kwargs: dict, limits: Sequence[int]) -> Iterator[dict]:
    """The same chunk tasks without Ray: a pool of one process per CPU (spawned, so each imports only
    this module, numpy and ``tokenizers``), or this process for a single chunk. Starting a local Ray
    only to pack costs ~20 s on 2 cores (its processes, one worker per CPU) - more than packing
    160 MB - so a command that has no Ray (``raycpt data prepare`` on one machine) packs here."""
    workers = min(len(chunks), os.cpu_count() or 1)
    if workers <= 1:
        yield from (_local_task(fn_name, c, kwargs, lim) for c, lim in zip(chunks, limits))
        return

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        futures = [pool.submit(_local_task, fn_name, c, kwargs, lim) for c, lim in zip(chunks, limits)]
        try:
            for f in as_completed(futures):
                yield f.result()
        finally:
            for f in futures:
                f.cancel()


def _doc_limits(chunks: list[dict], max_documents: int, wave: int) -> tuple[list[dict], list[int]]:
    """The chunks holding the first ``max_documents`` documents and how many of each to keep."""
    keep, limits, left = [], [], max_documents
    for i in range(0, len(chunks), wave):
        if left <= 0:
            break
        part = chunks[i:i + wave]
        counts = run_chunks("count", part, {})
        for c, rec in zip(part, counts):
            if left <= 0:
                break
            take = min(rec["documents"], left)
            if take > 0:
                keep.append(c)
                limits.append(take)
                left -= take
    return keep, limits


# ------------------------------------------------------------------------------------ the store

def _cpus() -> int:
    import ray

    if ray.is_initialized():
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    return os.cpu_count() or 1


@contextlib.contextmanager
def _progress(total_chunks: int, enabled: bool):
    """Yields ``update(record)``: one chunk done, on raycpt's one counting bar, with the tokens/s so far."""
    t0, tokens = time.time(), [0]
    with progress_bar("packing", total_chunks, enabled=enabled, unit="chunks", transient=True, rate="") as advance:
        def update(rec):
            tokens[0] += rec["tokens"]
            advance(1, rate=f"{tokens[0] / max(time.time() - t0, 1e-6):,.0f} tokens/s")

        yield update


def _build(data_cfg, tokenizer_path: str, root: Path, key: str, tok_hash: str, previous: Optional[StoreInfo],
           progress: bool) -> StoreInfo:
    t0 = time.time()
    for old in root.glob(f".tmp-{key}-*"):  # leftovers of an interrupted pack of this store
        shutil.rmtree(old, ignore_errors=True)
    tmp = root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        chunks = check_corpus(data_cfg)
        prints = fingerprints(data_cfg.corpus, full=_content_check(data_cfg))  # before reading: a change during the pack shows up next time
        tok = _tokenizer(tokenizer_path)
        eos = eos_id_of(tok)
        dtype = "uint16" if len(tok) <= np.iinfo(np.uint16).max + 1 else "int32"
        limits = None
        if data_cfg.max_documents is not None:
            chunks, limits = _doc_limits(chunks, int(data_cfg.max_documents), wave=2 * _cpus())
        (tmp / TOKENIZER_FILE).write_text(tok.backend_tokenizer.to_str(), encoding="utf-8")
        kwargs = {"tokenizer_file": str(tmp / TOKENIZER_FILE), "seq_len": int(data_cfg.seq_len), "eos_id": eos,
                  "dtype": dtype, "out_dir": str(tmp)}
        if getattr(data_cfg, "heldout_share", 0.0):
            kwargs.update(heldout_share=float(data_cfg.heldout_share), heldout_seed=int(data_cfg.heldout_seed))
        with _progress(len(chunks), progress) as update:
            shards = run_chunks("pack", chunks, kwargs, limits, on_done=update)
        docs = sum(s["documents"] for s in shards)
        blocks = sum(s["blocks"] for s in shards)
        tokens = sum(s["tokens"] for s in shards)
        if blocks == 0:
            raise RaycptError(f"data.corpus {list(data_cfg.corpus)} gives no full {data_cfg.seq_len}-token blocks "
                              f"({docs:,} documents, {tokens:,} tokens); add documents or lower data.seq_len")
        manifest = {
            "format": FORMAT_VERSION, "key": key, "build_id": uuid.uuid4().hex,
            "build": _build_number(previous) + 1, "created": time.time(),
            "sources": list(data_cfg.corpus), "text_field": data_cfg.text_field,
            "max_documents": data_cfg.max_documents, "seq_len": int(data_cfg.seq_len), "dtype": dtype,
            "bytes_per_token": int(np.dtype(dtype).itemsize), "tokenizer_path": tokenizer_path,
            "tokenizer_sha256": tok_hash, "eos_id": eos, "num_documents": docs, "num_blocks": blocks,
            "tokens_read": tokens, "pack_seconds": round(time.time() - t0, 3),
            "shards": [{"file": s["file"], "blocks": s["blocks"], "documents": s["documents"], "bytes": s["bytes"],
                        "sha256": s["sha256"]} for s in shards if s["blocks"] > 0],
            "fingerprints": prints,
        }
        manifest[SEAL] = manifest_seal(manifest)
        (tmp / TOKENIZER_FILE).unlink()  # the model folder keeps the tokenizer; the manifest has its hash
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        dest = root / key
        if dest.exists():  # a rebuild: swap, then drop the old one (open memory maps keep their files)
            trash = root / f".old-{key}-{uuid.uuid4().hex[:8]}"
            os.replace(dest, trash)
            os.replace(tmp, dest)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, dest)
        remember_digests({dest / s["file"]: s["sha256"] for s in manifest["shards"]}, root / DIGEST_MEMO)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log_build(root, {"key": key, "build": manifest["build"], "documents": docs, "blocks": blocks,
                     "tokens_read": tokens, "seconds": manifest["pack_seconds"], "time": manifest["created"],
                     "host": socket.gethostname(), "pid": os.getpid()})
    return StoreInfo(dest, manifest)


def ensure_packed(data_cfg, tokenizer_path: str, run_root, *, rebuild: bool = False, progress: bool = False
                  ) -> tuple[StoreInfo, bool]:
    """``(store, built)``: the packed store of ``data_cfg``, built now when missing or when it does not verify
    (:func:`raycpt.data.store.store_problem`, one line saying why; ``built`` True).

    A store whose corpus changed since it was packed is refused with one line (``rebuild=True``,
    i.e. ``raycpt data prepare --rebuild``, re-packs it). Concurrent callers pack once (file lock)."""
    root = store_root(data_cfg, run_root)
    tok_hash = tokenizer_hash(tokenizer_path)
    key = store_key(data_cfg, tok_hash)
    if not rebuild:
        found = find_packed(data_cfg, tokenizer_path, run_root)
        if found is not None:
            return found, False
    with build_lock(root, key):
        found = read_store(root / key)
        if found is not None and not rebuild and store_problem(found, _content_check(data_cfg)) is None:
            _check_fresh(found, data_cfg)  # packed by another process while we waited
            return found, False
        return _build(data_cfg, tokenizer_path, root, key, tok_hash, found, progress), True


def find_packed(data_cfg, tokenizer_path: str, run_root, say: Optional[Callable[[str], None]] = None
                ) -> Optional[StoreInfo]:
    """The complete store of ``data_cfg`` if there is one that verifies (no Ray needed), checked against the corpus
    (a changed corpus is refused: RaycptError). A store that does not verify (:func:`store_problem`) is None, with
    one line saying why (``say``, default stderr): the caller packs it again."""
    found = read_store(store_root(data_cfg, run_root) / store_key(data_cfg, tokenizer_hash(tokenizer_path)))
    if found is None:
        return None
    why = store_problem(found, _content_check(data_cfg))
    if why is not None:
        (say or _warn)(f"warning: packed store {found.path} does not verify ({why}): packing it again")
        return None
    _check_fresh(found, data_cfg)
    return found


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _build_number(previous: Optional[StoreInfo]) -> int:
    try:
        return int(previous.manifest.get("build", 0)) if previous is not None else 0
    except (TypeError, ValueError):
        return 0


def _content_check(data_cfg) -> bool:
    return getattr(data_cfg, "verify", "stat") == "content"


def _check_fresh(store: StoreInfo, data_cfg) -> None:
    what = corpus_problem(store, _content_check(data_cfg), sources=data_cfg.corpus)
    if what:
        raise RaycptError(f"data.corpus: {what} since it was packed into {store.path}; re-pack it with "
                          "`raycpt data prepare [CONFIG] [overrides] --rebuild` (runs that read this store then "
                          "see the new corpus)")


def describe_hit(store: StoreInfo) -> str:
    return f"corpus: packed store {store.key} reused: {store.describe()} at {store.path}"


def describe_build(store: StoreInfo) -> str:
    m = store.manifest
    rate = m["tokens_read"] / max(m["pack_seconds"], 1e-6)
    return (f"corpus: packed {m['num_documents']:,} documents into {m['num_blocks']:,} blocks x {m['seq_len']} tokens "
            f"in {m['pack_seconds']:.1f}s ({rate:,.0f} tokens/s, {len(m['shards'])} shard files) at {store.path}")
