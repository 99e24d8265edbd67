"""The training corpus as Ray Data: read, tokenize in batches, pack into ``seq_len`` blocks, shuffle.

Sources (``data.corpus``, a list; several are concatenated in order):

* ``builtin:wordnet-glosses`` - the shipped English WordNet 3.0 glosses (definitions and usage
  examples, one document per synset; ``raycpt/assets/wordnet_glosses.jsonl.gz``, made by
  ``scripts/make_wordnet_glosses.py``; licence notice in ``raycpt/assets/WORDNET_LICENSE.txt``);
* ``debian:fortunes-zh`` - Debian's ``fortunes-zh`` (Chinese sayings, Tang and Song poems), read
  at run time from ``/usr/share/games/fortunes/`` (GPL: its text is never copied into raycpt);
* files or globs: ``*.jsonl`` / ``*.json`` (one record per line, text in ``data.text_field``,
  ``.gz`` allowed), ``*.parquet`` (column ``data.text_field``), ``*.txt`` (one document per line);
* ``hf:DATASET_ID`` or ``hf:DATASET_ID:SPLIT`` - a Hugging Face hub dataset (needs the hub, i.e. a
  cluster with internet; offline this is one clear error line).

Pipeline (all Ray Data, order preserved): read -> keep ``data.max_documents`` -> ``map_batches``
of :data:`PACK_DOCS` documents: tokenize the batch (fast tokenizer, no special tokens), append EOS
to every document, concatenate and cut into ``seq_len`` blocks (the tail shorter than a block is
dropped, as Hugging Face's ``run_clm`` ``group_texts`` does) -> a 64-bit key per block from
``blake2b(seed, tokens)`` -> ``sort(key)``: a shuffle that depends only on the seed and the blocks'
contents, never on how Ray partitioned the data -> ``split(num_workers, equal=True)``: worker ``r``
reads the dataset named ``train_rank{r}`` (``ray.train.get_dataset_shard``), its own equal share,
in a fixed order, so a resumed worker skips exactly the micro-batches it had consumed.

The pure pieces (:func:`pack_token_lists`, :func:`block_keys`, :func:`shuffle_order`,
:func:`fortunes_documents`, :func:`iter_documents`, :func:`local_blocks`) need no Ray.
"""

from __future__ import annotations

import functools
import glob
import gzip
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

from raycpt.errors import RaycptError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
GLOSSES = ASSETS / "wordnet_glosses.jsonl.gz"
FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNE_FILES = ("chinese", "tang300", "song100")
PACK_DOCS = 512
"""Documents tokenized and packed together in one ``map_batches`` batch."""
SHARD_PREFIX = "train_rank"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# ------------------------------------------------------------------------------------ pure pieces

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


def block_keys(blocks: np.ndarray, seed: int) -> np.ndarray:
    """A uint64 key per block: ``blake2b(seed || tokens)``; sorting by it shuffles deterministically."""
    salt = int(seed).to_bytes(8, "little", signed=True)
    blocks = np.ascontiguousarray(blocks, dtype=np.int32)
    out = np.empty(len(blocks), dtype=np.uint64)
    for i, row in enumerate(blocks):
        out[i] = int.from_bytes(hashlib.blake2b(salt + row.tobytes(), digest_size=8).digest(), "little")
    return out


def shuffle_order(blocks: np.ndarray, seed: int) -> np.ndarray:
    """Indices that put ``blocks`` in the seeded order (stable for equal keys, i.e. equal blocks)."""
    return np.argsort(block_keys(blocks, seed), kind="stable")


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


def _expand(source: str) -> list[str]:
    paths = sorted(glob.glob(os.path.expanduser(source))) if any(c in source for c in "*?[") else \
        [os.path.expanduser(source)]
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(str(q) for q in Path(p).rglob("*") if q.is_file() and _kind(str(q)) is not None)
        else:
            out.append(p)
    if not out or not all(os.path.exists(p) for p in out):
        raise RaycptError(f"data.corpus: {source!r} matches no file")
    return [str(Path(p).resolve()) for p in out]


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


def _hf_parts(source: str) -> tuple[str, str]:
    rest = source[len("hf:"):]
    name, _, split = rest.partition(":")
    if not name:
        raise RaycptError(f"data.corpus: {source!r} needs a dataset id, e.g. hf:HuggingFaceFW/fineweb-edu:train")
    return name, split or "train"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or \
        os.environ.get("HF_DATASETS_OFFLINE", "").lower() in ("1", "true", "yes")


def _hf_error(source: str, e: Exception | None = None) -> RaycptError:
    why = "HF_HUB_OFFLINE is set" if e is None else f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return RaycptError(f"data.corpus: {source} needs the Hugging Face hub, which is not reachable here ({why}); "
                       "use JSONL/Parquet/text files or builtin:wordnet-glosses")


def iter_documents(sources: Sequence[str], text_field: str = "text", max_documents: Optional[int] = None
                   ) -> Iterator[str]:
    """Documents of the corpus in order, without Ray (tests, the plain-process benchmark)."""
    n = 0
    for source in sources:
        for doc in _iter_source(source, text_field):
            if max_documents is not None and n >= max_documents:
                return
            if doc and doc.strip():
                n += 1
                yield doc


def _open(path: str):
    return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")


def _iter_source(source: str, text_field: str) -> Iterator[str]:
    if source == "builtin:wordnet-glosses":
        yield from _iter_json(str(GLOSSES), "text")
    elif source == "debian:fortunes-zh":
        yield from fortunes_documents()
    elif source.startswith("hf:"):
        name, split = _hf_parts(source)
        if _offline():
            raise _hf_error(source)
        try:
            import datasets

            ds = datasets.load_dataset(name, split=split, streaming=True)
        except Exception as e:  # noqa: BLE001 - any hub failure is one line for the user
            raise _hf_error(source, e) from None
        for rec in ds:
            yield str(rec.get(text_field) or "")
    elif source.startswith("builtin:") or source.startswith("debian:"):
        raise RaycptError(f"data.corpus: unknown source {source!r}: use builtin:wordnet-glosses, debian:fortunes-zh, "
                          "hf:DATASET_ID, or JSONL/Parquet/text files")
    else:
        for path in _expand(source):
            kind = _file_kind(path, source)
            if kind == "json":
                yield from _iter_json(path, text_field)
            elif kind == "parquet":
                import pyarrow.parquet as pq

                table = pq.read_table(path, columns=[text_field])
                yield from (str(t or "") for t in table.column(text_field).to_pylist())
            else:
                with _open(path) as f:
                    yield from (line.rstrip("\n") for line in f)


def _iter_json(path: str, text_field: str) -> Iterator[str]:
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise RaycptError(f"data.corpus: {path} line {lineno} is not JSON") from None
            if not isinstance(rec, dict) or text_field not in rec:
                raise RaycptError(f"data.corpus: {path} line {lineno} has no field {text_field!r} (data.text_field)")
            yield str(rec[text_field] or "")


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def eos_id_of(tokenizer) -> int:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise RaycptError(f"the tokenizer of the model has no EOS token: packing needs one between documents")
    return int(eos)


def tokenize_and_pack(texts: Sequence[str], tokenizer, seq_len: int, seed: int) -> dict[str, np.ndarray]:
    """One batch: tokenize (no special tokens), pack with EOS, key each block. The map_batches body."""
    texts = [t for t in (str(x) for x in texts) if t.strip()]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    blocks = pack_token_lists(ids, seq_len, eos_id_of(tokenizer))
    return {"input_ids": blocks, "key": block_keys(blocks, seed)}


def local_blocks(sources: Sequence[str], tokenizer, seq_len: int, seed: int, text_field: str = "text",
                 max_documents: Optional[int] = None, pack_docs: int = PACK_DOCS) -> np.ndarray:
    """The packed, shuffled blocks without Ray (same batching rule as the Ray pipeline)."""
    blocks, batch = [], []
    for doc in iter_documents(sources, text_field, max_documents):
        batch.append(doc)
        if len(batch) == pack_docs:
            blocks.append(tokenize_and_pack(batch, tokenizer, seq_len, seed)["input_ids"])
            batch = []
    if batch:
        blocks.append(tokenize_and_pack(batch, tokenizer, seq_len, seed)["input_ids"])
    allb = np.concatenate(blocks) if blocks else np.zeros((0, seq_len), dtype=np.int32)
    return allb[shuffle_order(allb, seed)]


# ------------------------------------------------------------------------------------ Ray Data

def _read_source(source: str, text_field: str):
    import ray.data as rd

    if source == "builtin:wordnet-glosses":
        if not GLOSSES.is_file():
            raise RaycptError(f"builtin:wordnet-glosses: {GLOSSES} is missing; run scripts/make_wordnet_glosses.py")
        return rd.read_json(str(GLOSSES), override_num_blocks=1,
                            arrow_open_stream_args={"compression": "gzip"}).select_columns(["text"])
    if source == "debian:fortunes-zh":
        return rd.from_items([{"text": t} for t in fortunes_documents()], override_num_blocks=1)
    if source.startswith("hf:"):
        name, split = _hf_parts(source)
        if _offline():
            raise _hf_error(source)
        try:
            import datasets

            hf = datasets.load_dataset(name, split=split)
            ds = rd.from_huggingface(hf)
        except Exception as e:  # noqa: BLE001
            raise _hf_error(source, e) from None
        return ds.select_columns([text_field]).rename_columns({text_field: "text"}) if text_field != "text" else \
            ds.select_columns(["text"])
    parts = []
    for path in _expand(source):
        kind = _file_kind(path, source)
        if kind == "json":
            # Validate the first record here so a wrong field is one line, not a Ray stack trace.
            for _ in _iter_json(path, text_field):
                break
            kw = {"arrow_open_stream_args": {"compression": "gzip"}} if path.endswith(".gz") else {}
            ds = rd.read_json(path, override_num_blocks=1, **kw)
        elif kind == "parquet":
            import pyarrow.parquet as pq

            if text_field not in pq.read_schema(path).names:
                raise RaycptError(f"data.corpus: {path} has no column {text_field!r} (data.text_field)")
            ds = rd.read_parquet(path, columns=[text_field], override_num_blocks=1)
        else:
            kw = {"arrow_open_stream_args": {"compression": "gzip"}} if path.endswith(".gz") else {}
            ds = rd.read_text(path, override_num_blocks=1, **kw)
            parts.append(ds)
            continue
        ds = ds.select_columns([text_field])
        if text_field != "text":
            ds = ds.rename_columns({text_field: "text"})
        parts.append(ds)
    ds = parts[0]
    return ds.union(*parts[1:]) if len(parts) > 1 else ds


def _pack_batch(batch: dict, tokenizer_path: str, seq_len: int, seed: int) -> dict:
    return tokenize_and_pack(list(batch["text"]), _tokenizer(tokenizer_path), seq_len, seed)


def build_dataset(data_cfg, tokenizer_path: str, seed: int):
    """The lazy Ray Dataset of packed, seeded-shuffled blocks: rows ``{"input_ids": int32[seq_len]}``."""
    import logging

    from ray.data import DataContext

    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    parts = [_read_source(s, data_cfg.text_field) for s in data_cfg.corpus]
    ds = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    if data_cfg.max_documents is not None:
        ds = ds.limit(data_cfg.max_documents)
    ds = ds.map_batches(_pack_batch, batch_size=PACK_DOCS, batch_format="numpy",
                        fn_kwargs=dict(tokenizer_path=str(tokenizer_path), seq_len=int(data_cfg.seq_len),
                                       seed=int(seed)))
    return ds.sort("key").drop_columns(["key"])


def prepare_shards(data_cfg, tokenizer_path: str, seed: int, num_workers: int, micro_batch_size: int):
    """Build, materialize and split the corpus; ``({"train_rank0": ds0, ...}, total_blocks)``.

    Raises RaycptError when the corpus gives fewer blocks than one micro-batch per worker."""
    ds = build_dataset(data_cfg, tokenizer_path, seed).materialize()
    n = ds.count()
    need = num_workers * micro_batch_size
    if n < need:
        what = "no" if n == 0 else f"only {n}"
        raise RaycptError(f"data.corpus {list(data_cfg.corpus)} gives {what} full {data_cfg.seq_len}-token blocks; "
                          f"{num_workers} worker(s) x train.micro_batch_size={micro_batch_size} need at least {need} "
                          "(add documents or lower data.seq_len)")
    shards = ds.split(num_workers, equal=True) if num_workers > 1 else [ds]
    return {f"{SHARD_PREFIX}{r}": s for r, s in enumerate(shards)}, n


def heldout_blocks(data_cfg, tokenizer_path: str, num_docs: int, setting: str = "held-out loss",
                   raise_key: str = "the held-out document count") -> list[list[int]]:
    """``num_docs`` documents of ``data.corpus`` that follow the first ``data.max_documents`` (which the
    training reads, so these are never trained on), packed into ``data.seq_len`` blocks the way the
    training data is. Raises RaycptError (naming ``setting``) when there are none or too few tokens."""
    from transformers import AutoTokenizer

    start = int(data_cfg.max_documents or 0)
    docs = list(iter_documents(data_cfg.corpus, data_cfg.text_field, max_documents=start + num_docs))[start:]
    if not docs:
        raise RaycptError(f"{setting}: data.corpus has no documents after the first {start} (data.max_documents); "
                          "lower data.max_documents")
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    ids = tok(docs, add_special_tokens=False)["input_ids"]
    blocks = pack_token_lists(ids, data_cfg.seq_len, eos_id_of(tok))
    if len(blocks) == 0:
        raise RaycptError(f"{setting}: {len(docs)} held-out documents give no full block of "
                          f"data.seq_len={data_cfg.seq_len} tokens; raise {raise_key}")
    return [list(map(int, b)) for b in blocks]
