"""Corpus sources -> documents, in a fixed order, cut into *chunks* that pack independently.

Sources (``data.corpus``, a list; several are concatenated in order):

* ``builtin:wordnet-glosses`` - the shipped English WordNet 3.0 glosses (definitions and usage
  examples, one document per synset; ``raycpt/assets/wordnet_glosses.jsonl.gz``, made by
  ``scripts/make_wordnet_glosses.py``; licence notice in ``raycpt/assets/WORDNET_LICENSE.txt``);
* ``debian:fortunes-zh`` - Debian's ``fortunes-zh`` (Chinese sayings, Tang and Song poems), read
  at run time from ``/usr/share/games/fortunes/`` (GPL: its text is never copied into raycpt);
* files or globs: ``*.jsonl`` / ``*.json`` (one record per line, text in ``data.text_field``,
  ``.gz`` allowed), ``*.parquet`` (column ``data.text_field``), ``*.txt`` (one document per line);
* ``hf:DATASET_ID`` or ``hf:DATASET_ID:SPLIT`` - a Hugging Face hub dataset, read as a stream over
  its Parquet files (needs the hub; offline this is one clear error line).

A *chunk* is the unit of packing work (one Ray Data task): a byte range of :data:`CHUNK_BYTES`
of an uncompressed JSONL/text file (it owns the lines that *start* inside it), a run of row groups
of a Parquet file, a whole ``.gz`` file, a whole hub Parquet file, or a whole builtin source.
Chunk boundaries depend only on the files, never on how many CPUs or Ray blocks there are, so
the packed store is the same wherever it is built. A document is a non-blank text; the order of
documents is the order of the sources, files (sorted glob), and lines - the same order
:func:`iter_documents` gives, which the held-out documents (after ``data.max_documents``) use.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import gzip
import json
import os
import re
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence
from urllib.parse import quote

import numpy as np

from raycpt.errors import RaycptError, open_user_file

ASSETS = Path(__file__).resolve().parent.parent / "assets"
GLOSSES = ASSETS / "wordnet_glosses.jsonl.gz"
FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNE_FILES = ("chinese", "tang300", "song100")
MIN_CHUNK_BYTES = 1 << 20
MAX_CHUNK_BYTES = 64 << 20
CHUNKS_TARGET = 64
"""A chunk holds ``clamp(corpus bytes / CHUNKS_TARGET, MIN_CHUNK_BYTES, MAX_CHUNK_BYTES)`` bytes of
text (uncompressed JSONL/text, compressed Parquet row groups): a 5 MB corpus packs as 5 tasks, a
1 TB one as ~16k. The size depends only on the corpus, so the store does too."""
GZ_SPLIT_MAX = 64 << 20
"""``.gz`` files up to this size are split by lines (each task decompresses up to its range);
larger ones are one chunk each (split such a corpus into several files)."""
SNIFF_BYTES = 8192
MAX_LINE_BYTES = 4 << 20
"""A line (one JSONL record or one text document) is at most 4 MiB: reading and tokenising one line takes
about a hundred times its size in memory (a 50 MB line passed 5 GB resident), so a longer one is refused with
one line naming it; split such a text into several documents."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# ------------------------------------------------------------------------------------ packing

def pack_token_lists(token_lists: Iterable[Sequence[int]], seq_len: int, eos_id: int) -> np.ndarray:
    """Concatenate documents, each followed by ``eos_id``, and cut into full ``seq_len`` blocks.

    The tail shorter than ``seq_len`` is dropped. Returns int32 ``(num_blocks, seq_len)``."""
    parts = []
    eos = np.array([eos_id], dtype=np.int64)
    for ids in token_lists:
        parts.append(np.asarray(ids, dtype=np.int64))
        parts.append(eos)
    if not parts:
        return np.zeros((0, seq_len), dtype=np.int32)
    flat = np.concatenate(parts)
    n = len(flat) // seq_len
    return flat[: n * seq_len].reshape(n, seq_len).astype(np.int32)


def spread_sample(total: int, num: int, seed: int = 0) -> np.ndarray:
    """``num`` document indices out of ``total``, seeded and spread over the whole corpus: one uniform draw
    inside each of ``num`` equal strata of the index range (a corpus ordered noun -> verb -> adjective ->
    adverb then gives every part of it in proportion, where its tail gives only adverbs). Sorted."""
    num = min(int(num), int(total))
    if num <= 0:
        return np.zeros(0, dtype=np.int64)
    edges = np.linspace(0, total, num + 1)
    rng = np.random.default_rng(seed)
    lo, hi = np.ceil(edges[:-1]).astype(np.int64), np.maximum(np.ceil(edges[1:]).astype(np.int64), 1)
    return np.minimum(lo + (rng.random(num) * (hi - lo)).astype(np.int64), total - 1)


def block_documents(token_lists: Sequence[Sequence[int]], seq_len: int, doc_ids: Optional[Sequence] = None
                    ) -> list:
    """For the blocks :func:`pack_token_lists` cuts from these documents, the document each block belongs to
    (the one contributing most of its tokens, EOS counted with its document): the clusters of a
    document-clustered interval (:func:`raycpt.stats.ratio_delta_t`)."""
    ids = list(range(len(token_lists))) if doc_ids is None else list(doc_ids)
    owner = np.repeat(np.arange(len(token_lists)), [len(t) + 1 for t in token_lists])
    n = len(owner) // seq_len
    out = []
    for k in range(n):
        counts = np.bincount(owner[k * seq_len:(k + 1) * seq_len])
        out.append(ids[int(np.argmax(counts))])
    return out


def eos_id_of(tokenizer) -> int:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise RaycptError("the tokenizer of the model has no EOS token: packing needs one between documents")
    return int(eos)


def fortunes_documents(root: Path = FORTUNES_DIR, files: Sequence[str] = FORTUNE_FILES) -> list[str]:
    """Entries of Debian's fortunes-zh (``%``-separated), terminal colour codes removed."""
    docs = []
    found = False
    for name in files:
        p = Path(root) / name
        if not p.is_file():
            continue
        found = True
        for entry in p.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            text = _ANSI.sub("", entry).strip().strip("%").strip()
            if text:
                docs.append(text)
    if not found:
        raise RaycptError(f"debian:fortunes-zh: no fortune files under {root}; install the Debian package "
                          "fortunes-zh (apt-get install fortunes-zh)")
    return docs


# ------------------------------------------------------------------------------------ files

def expand_source(source: str) -> list[str]:
    """The files of a file/glob source, sorted, absolute. One line for a glob matching nothing,
    a missing file, or a directory."""
    path = os.path.expanduser(source)
    if any(c in source for c in "*?["):
        paths = sorted(p for p in glob.glob(path) if not os.path.isdir(p))
        if not paths:
            raise RaycptError(f"data.corpus: {source!r} matches no file")
    else:
        if os.path.isdir(path):
            raise RaycptError(f"data.corpus: {source} is a directory; name its files, e.g. {source.rstrip('/')}/*.jsonl")
        if not os.path.exists(path):
            raise RaycptError(f"data.corpus: {source!r} matches no file")
        paths = [path]
    out = [str(Path(p).resolve()) for p in paths]
    for p in out:
        _file_kind(p, source)
        open_user_file(p, "data.corpus").close()  # the bounded reader's open: a FIFO or a device is one line here
    return out


def _kind(path: str) -> Optional[str]:
    name = path.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "json"
    if name.endswith(".parquet") and not path.lower().endswith(".gz"):
        return "parquet"
    if name.endswith((".txt", ".text", ".md")):
        return "text"
    return None


def _file_kind(path: str, source: str) -> str:
    kind = _kind(path)
    if kind is None:
        raise RaycptError(f"data.corpus: {path} (from {source!r}) is not .jsonl/.json/.parquet/.txt (optionally .gz)")
    return kind


def check_file(path: str, kind: str, text_field: str) -> None:
    """Cheap checks of a corpus file before any work: readable text (not binary), the text field in
    the first record. One line each."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(path).names
        except Exception:  # noqa: BLE001 - any unreadable file
            raise RaycptError(f"data.corpus: {path} is not a readable Parquet file") from None
        if text_field not in names:
            raise RaycptError(f"data.corpus: {path} has no column {text_field!r} (data.text_field)")
        check_text_column(path, pq.read_schema(path), text_field)
        return
    try:
        with _open_binary(path) as f:
            head = f.read(SNIFF_BYTES)
    except (OSError, EOFError, gzip.BadGzipFile):
        raise RaycptError(f"data.corpus: {path} is not a readable {'gzip' if path.endswith('.gz') else 'text'} "
                          "file") from None
    if b"\x00" in head or not _utf8_prefix(head):
        raise RaycptError(f"data.corpus: {path} is a binary file, not UTF-8 text (JSONL, text or Parquet expected)")
    if kind == "json":
        with _open_binary(path) as f:
            for _ in _json_docs(_lines_of(f, path), path, text_field):
                break  # the first record only


def _utf8_prefix(data: bytes) -> bool:
    for cut in range(4):  # the sniffed prefix may end inside a multi-byte character
        try:
            data[: len(data) - cut].decode("utf-8")
            return True
        except UnicodeDecodeError:
            continue
    return False


def _open_binary(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _lines_of(f, path: str, start: int = 0, end: Optional[int] = None) -> Iterator[tuple[int, str]]:
    """``(byte offset or line number, text)`` of the lines that start in ``[start, end)``."""
    if start > 0:
        f.seek(start - 1)
        f.readline()  # the line holding byte start-1 belongs to the previous chunk
    pos = f.tell() if end is not None else 0
    n = 0
    while end is None or pos < end:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            break
        n += 1
        at = pos if end is not None else n
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise RaycptError(f"data.corpus: {path} {_where(at, end)} is a line longer than {MAX_LINE_BYTES:,} bytes; "
                              "a document is at most that long (one document per line): split it into several")
        pos += len(raw)
        if pos == len(raw) and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark opens the file
            raw = raw[3:]
        try:
            yield at, raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise RaycptError(f"data.corpus: {path} {_where(at, end)} is not UTF-8 text (a binary file?)") from None


def _where(at: int, end: Optional[int]) -> str:
    return f"at byte {at}" if end is not None else f"line {at}"


def _json_docs(lines: Iterable[tuple[int, str]], path: str, text_field: str, ranged: bool = False
               ) -> Iterator[str]:
    for at, line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise RaycptError(f"data.corpus: {path} {_where(at, 0 if ranged else None)} is not JSON") from None
        if not isinstance(rec, dict) or text_field not in rec:
            raise RaycptError(f"data.corpus: {path} {_where(at, 0 if ranged else None)} has no field "
                              f"{text_field!r} (data.text_field)")
        value = rec[text_field]
        if value is not None and not isinstance(value, str):
            shown = json.dumps(value, ensure_ascii=False)
            raise RaycptError(f"data.corpus: {path} {_where(at, 0 if ranged else None)}: field {text_field!r} is a "
                              f"{_json_type(value)} ({shown[:60]}{'...' if len(shown) > 60 else ''}), not a string "
                              "(data.text_field names the text)")
        yield value or ""


def _json_type(value) -> str:
    return {bool: "boolean", int: "number", float: "number", list: "list", dict: "object"}.get(type(value), "value")


def check_text_column(path: str, schema, field: str) -> None:
    """A Parquet text column must be a string column: an int64 or list column would be packed as the repr of
    each value."""
    import pyarrow as pa

    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
        raise RaycptError(f"data.corpus: {path} column {field!r} is of type {kind}, not a string column "
                          "(data.text_field names the text)")


# ------------------------------------------------------------------------------------ hub

def _hf_parts(source: str) -> tuple[str, str]:
    rest = source[len("hf:"):]
    name, _, split = rest.partition(":")
    if not name:
        raise RaycptError(f"data.corpus: {source!r} needs a dataset id, e.g. hf:HuggingFaceFW/fineweb-edu:train")
    return name, split or "train"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or \
        os.environ.get("HF_DATASETS_OFFLINE", "").lower() in ("1", "true", "yes")


def _hf_error(source: str, e: Exception | None = None) -> RaycptError:
    why = "HF_HUB_OFFLINE is set" if e is None else f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return RaycptError(f"data.corpus: {source} needs the Hugging Face hub, which is not reachable here ({why}); "
                       "use JSONL/Parquet/text files or builtin:wordnet-glosses")


def hf_parquet_files(source: str) -> list[dict]:
    """The Parquet files of a hub dataset split, as ``{"url": "hf://...", "size": bytes}``: the
    dataset's own ``*.parquet`` files of that split, else the hub's Parquet conversion
    (``refs/convert/parquet``). Nothing is downloaded here; the pack tasks stream them."""
    name, split = _hf_parts(source)
    if offline():
        raise _hf_error(source)
    try:
        from huggingface_hub import HfApi

        api = HfApi()
        picked, rev = [], "main"
        for rev in ("main", "refs/convert/parquet"):
            tree = api.list_repo_tree(name, repo_type="dataset", revision=rev, recursive=True)
            files = [f for f in tree if getattr(f, "path", "").endswith(".parquet")]
            picked = [f for f in files if split in Path(f.path).parts or Path(f.path).name.startswith(f"{split}-")]
            if picked:
                break
    except Exception as e:  # noqa: BLE001 - any hub failure is one line for the user
        raise _hf_error(source, e) from None
    if not picked:
        raise RaycptError(f"data.corpus: {source}: the dataset has no Parquet files for split {split!r}")
    return [{"url": f"hf://datasets/{name}@{quote(rev, safe='')}/{f.path}", "size": int(getattr(f, "size", 0) or 0)}
            for f in sorted(picked, key=lambda f: f.path)]


# ------------------------------------------------------------------------------------ chunks

def check_corpus(data_cfg) -> list[dict]:
    """:func:`plan_chunks` of ``data_cfg`` (every file checked), and one line for a corpus of
    empty files; cheap (no tokenising), so commands call it before starting Ray."""
    chunks = plan_chunks(data_cfg.corpus, data_cfg.text_field)
    if all("start" in c and c["end"] == 0 for c in chunks):  # only empty files (or Parquet without rows)
        raise RaycptError(f"data.corpus {list(data_cfg.corpus)} is empty (no bytes): it gives no full "
                          f"{data_cfg.seq_len}-token blocks")
    return chunks


def chunk_size_for(total_bytes: int) -> int:
    return int(min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, total_bytes // CHUNKS_TARGET)))


def plan_chunks(sources: Sequence[str], text_field: str = "text", chunk_bytes: Optional[int] = None) -> list[dict]:
    """Every chunk of the corpus in document order (see the module docstring), after checking each
    file (:func:`check_file`). Raises RaycptError (one line) for any bad source."""
    if chunk_bytes is None:
        chunk_bytes = chunk_size_for(sum(_source_bytes(s) for s in sources))
    out: list[dict] = []
    for source in sources:
        for c in _source_chunks(source, text_field, chunk_bytes):
            out.append({**c, "index": len(out), "source": source})
    return out


def _source_bytes(source: str) -> int:
    if source.startswith(("builtin:", "debian:", "hf:")):
        return GLOSSES.stat().st_size if source == "builtin:wordnet-glosses" and GLOSSES.is_file() else 0
    return sum(os.path.getsize(p) for p in expand_source(source))


def _gz_chunks(path: str, kind: str, text_field: str, chunk_bytes: int) -> list[dict]:
    if os.path.getsize(path) > GZ_SPLIT_MAX:
        return [{"kind": kind, "path": path, "field": text_field}]
    size = lines = 0
    last = b"\n"
    with gzip.open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            size, lines, last = size + len(block), lines + block.count(b"\n"), block
    lines += 0 if last.endswith(b"\n") else 1
    n = max(1, -(-size // chunk_bytes))
    per = max(1, -(-lines // n))
    return [{"kind": kind, "path": path, "field": text_field, "line_start": a, "line_end": min(a + per, lines)}
            for a in range(0, max(lines, 1), per)]


def _source_chunks(source: str, text_field: str, chunk_bytes: int) -> list[dict]:
    if source == "builtin:wordnet-glosses":
        if not GLOSSES.is_file():
            raise RaycptError(f"builtin:wordnet-glosses: {GLOSSES} is missing; run scripts/make_wordnet_glosses.py")
        return _gz_chunks(str(GLOSSES), "json", "text", chunk_bytes)
    if source == "debian:fortunes-zh":
        fortunes_documents()  # raises when the package is missing
        return [{"kind": "fortunes"}]
    if source.startswith("hf:"):
        return [{"kind": "hf", "path": f["url"], "field": text_field} for f in hf_parquet_files(source)]
    if source.startswith(("builtin:", "debian:")):
        raise RaycptError(f"data.corpus: unknown source {source!r}: use builtin:wordnet-glosses, debian:fortunes-zh, "
                          "hf:DATASET_ID, or JSONL/Parquet/text files")
    chunks = []
    for path in expand_source(source):
        kind = _file_kind(path, source)
        check_file(path, kind, text_field)
        if kind == "parquet":
            chunks += _parquet_chunks(path, text_field, chunk_bytes)
        elif path.endswith(".gz"):
            chunks += _gz_chunks(path, kind, text_field, chunk_bytes)
        else:
            size = os.path.getsize(path)
            for start in range(0, max(size, 1), chunk_bytes):
                chunks.append({"kind": kind, "path": path, "field": text_field, "start": start,
                               "end": min(start + chunk_bytes, size)})
    return chunks


def _parquet_chunks(path: str, text_field: str, chunk_bytes: int) -> list[dict]:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    chunks, first, acc = [], 0, 0
    for g in range(meta.num_row_groups):
        acc += meta.row_group(g).total_byte_size
        if acc >= chunk_bytes or g == meta.num_row_groups - 1:
            chunks.append({"kind": "parquet", "path": path, "field": text_field, "start": first, "end": g + 1})
            first, acc = g + 1, 0
    return chunks


def chunk_documents(chunk: dict) -> Iterator[str]:
    """The non-blank documents of one chunk, in order."""
    kind = chunk["kind"]
    if kind == "fortunes":
        raw: Iterable[str] = fortunes_documents()
    elif kind == "hf":
        raw = _hf_texts(chunk["path"], chunk["field"])
    elif kind == "parquet":
        raw = _parquet_texts(chunk["path"], chunk["field"], chunk["start"], chunk["end"])
    else:
        raw = _file_texts(chunk)
    for doc in raw:
        if doc and doc.strip():
            yield doc


def _file_texts(chunk: dict) -> Iterator[str]:
    path, start, end = chunk["path"], chunk.get("start", 0), chunk.get("end")
    with _open_binary(path) as f:
        lines = _lines_of(f, path, start, end)
        if "line_start" in chunk:  # a line range of a .gz file (line numbers count from 1)
            a, b = chunk["line_start"], chunk["line_end"]
            lines = (x for x in itertools.takewhile(lambda x: x[0] <= b, lines) if x[0] > a)
        if chunk["kind"] == "json":
            yield from _json_docs(lines, path, chunk["field"], ranged=end is not None)
        else:
            yield from (line for _, line in lines)


def _parquet_texts(path: str, field: str, first: int, last: int) -> Iterator[str]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=4096, row_groups=list(range(first, last)), columns=[field]):
        yield from (t or "" for t in batch.column(0).to_pylist())


def _hf_texts(url: str, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        from huggingface_hub import HfFileSystem

        f = HfFileSystem().open(url.removeprefix("hf://"), "rb")
        pf = pq.ParquetFile(f)
    except Exception as e:  # noqa: BLE001
        raise _hf_error(url, e) from None
    if field not in pf.schema_arrow.names:
        raise RaycptError(f"data.corpus: {url} has no column {field!r} (data.text_field)")
    check_text_column(url, pf.schema_arrow, field)
    with f:
        for batch in pf.iter_batches(batch_size=4096, columns=[field]):
            yield from (t or "" for t in batch.column(0).to_pylist())


def iter_documents(sources: Sequence[str], text_field: str = "text", max_documents: Optional[int] = None
                   ) -> Iterator[str]:
    """Documents of the corpus in order, without Ray (held-out documents, tests, the plain benchmark)."""
    n = 0
    for chunk in plan_chunks(sources, text_field):
        for doc in chunk_documents(chunk):
            if max_documents is not None and n >= max_documents:
                return
            n += 1
            yield doc


def is_heldout(text: str, share: float, seed: int = 0) -> bool:
    """Whether a document belongs to the held-out set: a seeded 64-bit hash of its text below ``share``.
    Decided by the text alone, so every packing worker agrees without a global document index, the set
    is spread over the whole corpus, and duplicates of a held-out document are held out too."""
    h = hashlib.blake2b(f"{int(seed)}\0{text}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "big") < share * 2.0 ** 64


def heldout_documents(data_cfg, num_docs: int, setting: str = "held-out loss") -> list[str]:
    """The held-out documents: with ``data.heldout_share`` > 0, ``num_docs`` evenly spaced ones among those
    the hash holds out of training (read over the first ``data.max_documents``, the training range, or the
    whole corpus); otherwise the ``num_docs`` after the first ``data.max_documents`` (the corpus tail)."""
    share = float(getattr(data_cfg, "heldout_share", 0.0) or 0.0)
    if share <= 0:
        start = int(data_cfg.max_documents or 0)
        docs = list(iter_documents(data_cfg.corpus, data_cfg.text_field, max_documents=start + num_docs))[start:]
        if not docs:
            raise RaycptError(f"{setting}: data.corpus has no documents after the first {start} "
                              "(data.max_documents); lower data.max_documents")
        return docs
    seed = int(getattr(data_cfg, "heldout_seed", 0))
    cands = [d for d in iter_documents(data_cfg.corpus, data_cfg.text_field, data_cfg.max_documents)
             if is_heldout(d, share, seed)]
    if len(cands) < num_docs:
        raise RaycptError(f"{setting}: data.heldout_share={share:g} holds out {len(cands)} documents, fewer than "
                          f"the {num_docs} asked for; raise data.heldout_share")
    pick = np.unique(np.round(np.linspace(0, len(cands) - 1, num_docs)).astype(np.int64))
    return [cands[i] for i in pick]


class HeldoutBlocks(list):
    """The held-out token blocks (a plain list of lists, as JSON writes it) with ``documents``: the index of
    each block's document among the held-out documents, the clusters of the held-out loss's interval."""

    documents: list


def heldout_blocks(data_cfg, tokenizer_path: str, num_docs: int, setting: str = "held-out loss",
                   raise_key: str = "the held-out document count") -> HeldoutBlocks:
    """The held-out documents (:func:`heldout_documents`: never trained on) packed into ``data.seq_len``
    blocks the way the training data is, with the document of each block (``.documents``). Raises
    RaycptError (naming ``setting``) when there are none or too few tokens."""
    blocks, docs = heldout_blocks_and_documents(data_cfg, tokenizer_path, num_docs, setting, raise_key)
    out = HeldoutBlocks(blocks)
    out.documents = docs
    return out


def heldout_blocks_and_documents(data_cfg, tokenizer_path: str, num_docs: int, setting: str = "held-out loss",
                                 raise_key: str = "the held-out document count") -> tuple[list[list[int]], list]:
    """:func:`heldout_blocks` and, per block, the index of its document among the held-out documents (the
    clusters of the held-out loss's interval, :func:`block_documents`)."""
    return pack_documents(heldout_documents(data_cfg, num_docs, setting), data_cfg, tokenizer_path, setting,
                          raise_key)


def pack_documents(docs: list[str], data_cfg, tokenizer_path: str, setting: str,
                   raise_key: str) -> tuple[list[list[int]], list]:
    """``docs`` packed into ``data.seq_len`` blocks the way training packs them (joined with EOS), and the index of
    each block's document (:func:`block_documents`); RaycptError naming ``setting`` when no full block results."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    ids = tok(docs, add_special_tokens=False)["input_ids"]
    blocks = pack_token_lists(ids, data_cfg.seq_len, eos_id_of(tok))
    if len(blocks) == 0:
        raise RaycptError(f"{setting}: {len(docs)} held-out documents give no full block of "
                          f"data.seq_len={data_cfg.seq_len} tokens; raise {raise_key}")
    return [list(map(int, b)) for b in blocks], block_documents(ids, data_cfg.seq_len)
