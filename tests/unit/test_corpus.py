"""Corpus pieces without Ray: packing against hand examples, chunks against a naive line reader,
the packed store against a hand-packed reference, freshness, and the per-epoch order."""

import gzip
import json
import os

import numpy as np
import pytest

from raycpt.config import DataConfig
from raycpt.data.corpus import (GLOSSES, chunk_documents, fortunes_documents, heldout_blocks, iter_documents,
                                pack_token_lists, plan_chunks)
from raycpt.data.pack import ensure_packed, find_packed
from raycpt.data.store import builds_logged, list_stores, store_root
from raycpt.data.stream import ArrayBlocks, EpochOrder, PackedBlocks, iter_micro_batches
from raycpt.errors import RaycptError
from tiny import save_tiny, tiny_tokenizer


def test_pack_with_eos_hand_example():
    docs = [[1, 2, 3], [4, 5], [6]]
    # stream: 1 2 3 E 4 5 E 6 E  (E = 9)
    np.testing.assert_array_equal(pack_token_lists(docs, 3, 9), [[1, 2, 3], [9, 4, 5], [9, 6, 9]])
    np.testing.assert_array_equal(pack_token_lists(docs, 4, 9), [[1, 2, 3, 9], [4, 5, 9, 6]])  # tail "9" dropped
    assert pack_token_lists(docs, 10, 9).shape == (0, 10)
    assert pack_token_lists([], 4, 9).shape == (0, 4)
    assert pack_token_lists(docs, 3, 9).dtype == np.int32


def test_readers(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "first doc"}) + "\n\n" + json.dumps({"body": "second"}) + "\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"body": "third"}) + "\n")
    (tmp_path / "c.txt").write_text("line one\n\nline two\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["pq doc"]}), tmp_path / "d.parquet")
    docs = list(iter_documents([str(tmp_path / "*.jsonl*"), str(tmp_path / "d.parquet")], text_field="body"))
    assert docs == ["first doc", "second", "third", "pq doc"]
    assert list(iter_documents([str(tmp_path / "c.txt")])) == ["line one", "line two"]
    assert list(iter_documents([str(tmp_path / "a.jsonl")], "body", max_documents=1)) == ["first doc"]
    with pytest.raises(RaycptError, match="no field 'text'"):
        list(iter_documents([str(tmp_path / "a.jsonl")]))
    with pytest.raises(RaycptError, match="matches no file"):
        list(iter_documents([str(tmp_path / "missing.jsonl")]))
    with pytest.raises(RaycptError, match="matches no file"):
        list(iter_documents([str(tmp_path / "*.nothing.jsonl")]))
    with pytest.raises(RaycptError, match="is a directory"):
        list(iter_documents([str(tmp_path)]))
    with pytest.raises(RaycptError, match="unknown source"):
        list(iter_documents(["builtin:nope"]))
    (tmp_path / "bin.jsonl").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(RaycptError, match="is a binary file"):
        list(iter_documents([str(tmp_path / "bin.jsonl")]))


def _lines_corpus(path, n, seed=0):
    rng = np.random.default_rng(seed)
    docs = [" ".join(f"w{int(x)}" for x in rng.integers(0, 99, size=int(rng.integers(1, 40)))) for _ in range(n)]
    with open(path, "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"text": d}) + "\n")
            if i % 7 == 3:
                f.write("\n")  # blank lines are not documents
    return docs


@pytest.mark.parametrize("chunk_bytes", [97, 1000, 1 << 20])
def test_byte_range_chunks_hold_every_line_once_in_order(tmp_path, chunk_bytes):
    docs = _lines_corpus(tmp_path / "c.jsonl", 300)
    chunks = plan_chunks([str(tmp_path / "c.jsonl")], chunk_bytes=chunk_bytes)
    assert len(chunks) == -(-os.path.getsize(tmp_path / "c.jsonl") // chunk_bytes)
    assert [d for c in chunks for d in chunk_documents(c)] == docs


def test_gz_and_parquet_chunks_hold_every_document_once(tmp_path):
    docs = _lines_corpus(tmp_path / "c.jsonl", 500)
    with gzip.open(tmp_path / "c.jsonl.gz", "wb") as f:
        f.write((tmp_path / "c.jsonl").read_bytes())
    chunks = plan_chunks([str(tmp_path / "c.jsonl.gz")], chunk_bytes=2000)
    assert len(chunks) > 5 and all("line_start" in c for c in chunks)
    assert [d for c in chunks for d in chunk_documents(c)] == docs
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": docs}), tmp_path / "p.parquet", row_group_size=40)
    chunks = plan_chunks([str(tmp_path / "p.parquet")], chunk_bytes=1500)
    assert len(chunks) > 2
    assert [d for c in chunks for d in chunk_documents(c)] == docs
    # the shipped glosses split by lines too, and read the same as one pass over the file
    gl = plan_chunks(["builtin:wordnet-glosses"], chunk_bytes=1 << 20)
    with gzip.open(GLOSSES, "rt", encoding="utf-8") as f:
        want = [json.loads(line)["text"] for line in f if line.strip()]
    assert len(gl) > 1 and [d for c in gl for d in chunk_documents(c)] == want


def test_hub_source_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RaycptError) as e:
        list(iter_documents(["hf:someone/some-corpus"]))
    assert "needs the Hugging Face hub" in str(e.value) and "\n" not in str(e.value)


def test_hub_source_streams_the_split_s_parquet_files(monkeypatch, tmp_path):
    """The hub is replaced by a folder: the listing and the file system are the only hub calls."""
    import huggingface_hub
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    (tmp_path / "data").mkdir()
    files = {"data/train-00000-of-00002.parquet": ["a", "b"], "data/train-00001-of-00002.parquet": ["c"],
             "data/test-00000-of-00001.parquet": ["not train"]}
    for name, docs in files.items():
        pq.write_table(pa.table({"content": docs}), tmp_path / name)

    class Entry:
        def __init__(self, path):
            self.path, self.size = path, (tmp_path / path).stat().st_size

    listed = []
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", lambda self, name, **kw: listed.append(
        (name, kw["revision"])) or [Entry(p) for p in files])
    monkeypatch.setattr(huggingface_hub.HfFileSystem, "open",
                        lambda self, path, mode="rb": open(tmp_path / path.split("@main/", 1)[1], mode))
    chunks = plan_chunks(["hf:someone/corpus:train"], text_field="content")
    assert [c["path"] for c in chunks] == ["hf://datasets/someone/corpus@main/data/train-00000-of-00002.parquet",
                                           "hf://datasets/someone/corpus@main/data/train-00001-of-00002.parquet"]
    assert list(iter_documents(["hf:someone/corpus:train"], text_field="content")) == ["a", "b", "c"]
    assert listed[0] == ("someone/corpus", "main")
    with pytest.raises(RaycptError, match="has no column 'text'"):
        list(iter_documents(["hf:someone/corpus:train"]))


def test_fortunes_parser_strips_colour_codes(tmp_path):
    # synthetic entries in the fortune file format (the real GPL text is only read at run time)
    (tmp_path / "chinese").write_text("第一条\n\n\x1b[33m    -- 作者\x1b[m\n%\n第二条\n%\n")
    docs = fortunes_documents(tmp_path, files=("chinese", "absent"))
    assert docs == ["第一条\n\n    -- 作者", "第二条"]
    with pytest.raises(RaycptError, match="fortunes-zh"):
        fortunes_documents(tmp_path / "nowhere")


def test_shipped_glosses_asset():
    assert GLOSSES.is_file() and GLOSSES.stat().st_size < 3_000_000
    assert (GLOSSES.parent / "WORDNET_LICENSE.txt").is_file()
    docs = list(iter_documents(["builtin:wordnet-glosses"], max_documents=200))
    assert len(docs) == 200 and all("(noun): " in d or "(verb): " in d or "(adjective): " in d or "(adverb): " in d
                                    for d in docs)


# ------------------------------------------------------------------------------------ the store

def _hand_pack(docs, tok, seq_len):
    """Naive reference: encode each document with the transformers tokenizer, EOS after each, cut."""
    flat = []
    for d in docs:
        flat += tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    n = len(flat) // seq_len
    return np.array(flat[: n * seq_len], dtype=np.int64).reshape(n, seq_len)


def test_pack_once_store_matches_hand_packing(tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    tok = tiny_tokenizer()
    docs = _lines_corpus(tmp_path / "c.jsonl", 400)
    cfg = DataConfig(corpus=[str(tmp_path / "c.jsonl")], seq_len=16, max_documents=350)
    store, built = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    assert built and store.manifest["build"] == 1 and store.manifest["num_documents"] == 350
    assert store.path.parent == store_root(cfg, tmp_path / "runs") == (tmp_path / "runs" / "packed").resolve()
    # small files: one chunk, so the store is exactly the hand-packed first 350 documents
    blocks = PackedBlocks(store.path, store.manifest)
    want = _hand_pack(docs[:350], tok, 16)
    assert store.num_blocks == len(want) and blocks.rows(np.arange(len(want))).tolist() == want.tolist()
    assert store.manifest["dtype"] == "uint16" and store.manifest["bytes_per_token"] == 2
    # the held-out documents are the ones after the store's: same packing rule, disjoint documents
    held = heldout_blocks(cfg, str(tiny), 30)
    assert held == _hand_pack(docs[350:380], tok, 16).tolist()
    # second call: a hit, nothing tokenised again
    again, built = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    assert not built and again.build_id == store.build_id
    assert len(builds_logged(store.path.parent, store.key)) == 1
    assert [s.key for s in list_stores(store.path.parent)] == [store.key]
    assert not [p for p in store.path.parent.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_multi_chunk_store_is_the_concatenation_of_chunk_packs(tmp_path, monkeypatch):
    import raycpt.data.corpus as corpus

    monkeypatch.setattr(corpus, "MIN_CHUNK_BYTES", 4000)  # a 40 kB file -> 4000-byte chunks
    tiny = save_tiny(tmp_path / "tiny")
    tok = tiny_tokenizer()
    _lines_corpus(tmp_path / "c.jsonl", 600)
    cfg = DataConfig(corpus=[str(tmp_path / "c.jsonl")], seq_len=16)
    store, _ = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    chunks = plan_chunks(cfg.corpus)
    assert len(chunks) > 3 and len(store.manifest["shards"]) == len(chunks)
    want = np.concatenate([_hand_pack(list(chunk_documents(c)), tok, 16) for c in chunks])
    got = PackedBlocks(store.path, store.manifest).rows(np.arange(store.num_blocks))
    assert got.tolist() == want.tolist()


def test_changed_corpus_is_refused_then_rebuilt(tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    _lines_corpus(tmp_path / "c.jsonl", 100)
    cfg = DataConfig(corpus=[str(tmp_path / "c.jsonl")], seq_len=16)
    store, _ = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    os.utime(tmp_path / "c.jsonl")  # touched, same bytes: still the same corpus
    assert find_packed(cfg, str(tiny), tmp_path / "runs").build_id == store.build_id
    with open(tmp_path / "c.jsonl", "a") as f:
        f.write(json.dumps({"text": "one more document"}) + "\n")
    with pytest.raises(RaycptError, match=r"c.jsonl changed \(size .* since it was packed.*--rebuild") as e:
        ensure_packed(cfg, str(tiny), tmp_path / "runs")
    assert "\n" not in str(e.value)
    new, built = ensure_packed(cfg, str(tiny), tmp_path / "runs", rebuild=True)
    assert built and new.manifest["build"] == 2 and new.path == store.path and new.build_id != store.build_id
    assert len(builds_logged(store.path.parent, store.key)) == 2


def test_bad_record_deep_in_the_file_leaves_no_store(tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    _lines_corpus(tmp_path / "c.jsonl", 100)
    with open(tmp_path / "c.jsonl", "a") as f:
        f.write(json.dumps({"body": "no text field"}) + "\n")
    cfg = DataConfig(corpus=[str(tmp_path / "c.jsonl")], seq_len=16)
    with pytest.raises(RaycptError, match="has no field 'text'"):
        ensure_packed(cfg, str(tiny), tmp_path / "runs")
    root = tmp_path / "runs" / "packed"
    assert list_stores(root) == [] and not [p for p in root.iterdir() if p.is_dir()]


# ------------------------------------------------------------------------------------ the order

def _naive_order(counts, seed, epoch, window):
    """The documented order, written out directly."""
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    perm = np.random.default_rng([seed, epoch, 0]).permutation(len(counts))
    laid = np.concatenate([np.arange(offsets[j], offsets[j] + counts[j]) for j in perm])
    out = []
    for w, a in enumerate(range(0, len(laid), window)):
        win = laid[a:a + window]
        out.append(win[np.random.default_rng([seed, epoch, 1, w]).permutation(len(win))])
    return np.concatenate(out)


def test_epoch_order_is_the_documented_one():
    counts = [5, 0, 17, 3, 9, 11]
    for epoch in (0, 1, 5):
        order = EpochOrder(counts, seed=7, epoch=epoch, window=8).full()
        np.testing.assert_array_equal(order, _naive_order(counts, 7, epoch, 8))
        assert sorted(order) == list(range(sum(counts)))


def test_two_epochs_see_different_orders_each_reproducible_from_the_seed():
    blocks = np.arange(60 * 4).reshape(60, 4)
    src = ArrayBlocks(blocks, counts=[20, 25, 15])

    def first_epochs(seed, world=1, rank=0):
        it = iter_micro_batches(src, 3, rank=rank, world=world, seed=seed, window=16)
        return [(e, rows[:, 0] // 4) for e, rows in (next(it) for _ in range(40))]

    a, b = first_epochs(1), first_epochs(1)
    assert [e for e, _ in a] == [0] * 20 + [1] * 20
    ep0 = np.concatenate([r for e, r in a if e == 0])
    ep1 = np.concatenate([r for e, r in a if e == 1])
    assert sorted(ep0) == sorted(ep1) == list(range(60))  # every block once per epoch
    assert not np.array_equal(ep0, ep1)  # ... in another order
    assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(a, b))  # same seed, same order
    assert not np.array_equal(ep0, np.concatenate([r for e, r in first_epochs(2) if e == 0]))
    # two ranks: disjoint shares of the same epoch order; together 20 micro-batches of 3 = 60 blocks... minus 0
    r0 = np.concatenate([r for e, r in first_epochs(1, 2, 0) if e == 0])
    r1 = np.concatenate([r for e, r in first_epochs(1, 2, 1) if e == 0])
    assert len(r0) == len(r1) == 30 and not set(r0) & set(r1)
    want = EpochOrder([20, 25, 15], 1, 0, 16).full()
    np.testing.assert_array_equal(r0, np.concatenate([want[(2 * k) * 3:(2 * k + 1) * 3] for k in range(10)]))


def test_skip_is_arithmetic_and_equals_reading():
    src = ArrayBlocks(np.arange(50 * 2).reshape(50, 2), counts=[30, 20])
    full = iter_micro_batches(src, 4, seed=3, window=7)
    seq = [next(full) for _ in range(30)]  # 12 per epoch: crosses two epoch boundaries
    for skip in (0, 5, 12, 13, 29):
        e, rows = next(iter_micro_batches(src, 4, seed=3, window=7, skip=skip))
        assert e == seq[skip][0] and np.array_equal(rows, seq[skip][1])
    with pytest.raises(RaycptError, match="fewer than one micro-batch"):
        next(iter_micro_batches(ArrayBlocks(np.zeros((3, 2))), 2, world=2))


# ------------------------------------------------------------------------------ issue 24: the held-out sample
def test_spread_sample_covers_the_whole_corpus_seeded():
    import numpy as np

    from raycpt.data.corpus import spread_sample

    idx = spread_sample(31587, 128, seed=3)
    assert len(idx) == 128 == len(set(idx.tolist())) and (np.diff(idx) > 0).all()
    # one document per stratum of 31587 / 128 = 246.8 documents: each quarter of the corpus holds 32
    assert [int(((idx >= q * 31587 / 4) & (idx < (q + 1) * 31587 / 4)).sum()) for q in range(4)] == [32] * 4
    assert (spread_sample(31587, 128, seed=3) == idx).all() and not (spread_sample(31587, 128, seed=4) == idx).all()
    assert spread_sample(5, 10).tolist() == [0, 1, 2, 3, 4]


def test_block_documents_names_the_majority_document_of_each_block():
    from raycpt.data.corpus import block_documents, pack_token_lists

    docs = [[1] * 5, [2] * 2, [3] * 9]  # with EOS: 6, 3, 10 tokens -> 19 tokens, blocks of 4: 4 full blocks
    assert len(pack_token_lists(docs, 4, 0)) == 4
    # block 0: d0 x4; block 1: d0 x2, d1 x2 (tie -> the first); block 2: d1 x1, d2 x3; block 3: d2 x4
    assert block_documents(docs, 4, ["a", "b", "c"]) == ["a", "a", "c", "c"]


def test_heldout_share_holds_documents_out_of_the_store_everywhere_in_the_corpus(tmp_path):
    import hashlib

    from raycpt.data.corpus import heldout_blocks_and_documents, heldout_documents

    tiny = save_tiny(tmp_path / "tiny")
    tok = tiny_tokenizer()
    docs = _lines_corpus(tmp_path / "c.jsonl", 400)
    cfg = DataConfig(corpus=[str(tmp_path / "c.jsonl")], seq_len=16, max_documents=350, heldout_share=0.1,
                     heldout_seed=1)

    def held(d):  # the rule, written here: blake2b-64 of "seed\0text" below share * 2^64
        h = int.from_bytes(hashlib.blake2b(f"1\0{d}".encode(), digest_size=8).digest(), "big")
        return h < 0.1 * 2 ** 64

    out = [i for i, d in enumerate(docs[:350]) if held(d)]
    assert 15 < len(out) < 60  # ~35 of 350
    store, _ = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    keep = [d for i, d in enumerate(docs[:350]) if i not in set(out)]
    assert store.manifest["num_documents"] == len(keep)
    want = _hand_pack(keep, tok, 16)
    assert PackedBlocks(store.path, store.manifest).rows(np.arange(len(want))).tolist() == want.tolist()
    # another key than the store without a held-out set
    plain, _ = ensure_packed(DataConfig(corpus=cfg.corpus, seq_len=16, max_documents=350), str(tiny),
                             tmp_path / "runs")
    assert plain.key != store.key
    # the held-out sample: 12 evenly spaced among the held-out documents, spread over the training range
    sample = heldout_documents(cfg, 12)
    idx = [docs.index(d) for d in sample]
    assert set(idx) <= set(out) and len(idx) == 12 and idx == sorted(idx)
    assert idx[0] < 350 / 4 and idx[-1] > 3 * 350 / 4
    blocks, doc_of = heldout_blocks_and_documents(cfg, str(tiny), 12)
    assert blocks == _hand_pack(sample, tok, 16).tolist() and len(doc_of) == len(blocks)
    assert doc_of == sorted(doc_of) and set(doc_of) <= set(range(12))
    with pytest.raises(RaycptError, match="raise data.heldout_share"):
        heldout_documents(cfg, 1000)


@pytest.mark.parametrize("value, kind", [(12345, "number"), (["a", "b", 1], "list"), ({"k": 2}, "object"),
                                         (True, "boolean"), (1.5, "number")])
def test_a_jsonl_text_that_is_not_a_string_is_refused_naming_field_type_and_line(tmp_path, value, kind):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": value}) + "\n")
    with pytest.raises(RaycptError) as e:
        list(iter_documents([str(p)]))
    msg = str(e.value)
    assert f"c.jsonl at byte 17: field 'text' is a {kind}" in msg and "not a string" in msg and "\n" not in msg
    p.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": None}) + "\n")  # null stays an empty doc
    assert list(iter_documents([str(p)])) == ["a"]  # null is an empty document, skipped as before


@pytest.mark.parametrize("column", [[0, 1, 2], [[1.5, 2.5], [3.0]]])
def test_a_parquet_text_column_that_is_not_strings_is_refused_before_reading(tmp_path, column):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": column}), p)
    with pytest.raises(RaycptError, match=r"column 'text' is of type (int64|list<element: double>), not a string column"):
        list(iter_documents([str(p)]))
    pq.write_table(pa.table({"text": ["x", None, "y"]}), p)
    assert list(iter_documents([str(p)])) == ["x", "y"]


def test_a_utf8_byte_order_mark_does_not_break_the_first_record(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + (json.dumps({"text": "first"}) + "\n" + json.dumps({"text": "second"})).encode())
    assert list(iter_documents([str(p)])) == ["first", "second"]
    t = tmp_path / "bom.txt"
    t.write_bytes(b"\xef\xbb\xbfone\ntwo\n")
    assert list(iter_documents([str(t)])) == ["one", "two"]
